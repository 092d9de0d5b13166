"""Tracebacks in the shapes people paste, rewritten to CPython's, vectorized.

The multiline grouper (:mod:`.multiline`) and the rule packs' ``frames`` read Python
tracebacks as CPython prints them (``traceback.print_exception``: ``Traceback (most recent
call last):``, then ``  File "<path>", line <n>, in <func>`` and the code, then the
exception). Pasted logs also carry three other renderings of the same frames; each line of
them is rewritten in place (offsets kept), before grouping:

* **IPython / Jupyter** (``IPython.core.ultratb``, IPython 8: ``OutOfMemoryError   Traceback
  (most recent call last)``, ``Cell In[21], line 2``, ``File /usr/lib/.../save.py:1298, in
  unsloth_save_model(self, ...)``, code lines ``----> 2 model.save(...)``; IPython 7:
  ``/usr/lib/.../serialization.py in save(obj, f, ...)``, ``<ipython-input-9-…> in
  <module>``);
* **Google Colab** (its frames are links: ``[/usr/lib/.../save.py](https://localhost:8080/#)
  in _merge_lora(layer, name)``; collapsed frames ``3 frames``);
* **Rich** (``rich.traceback``, as accelerate and kohya's scripts install it: a box
  ``╭──── Traceback (most recent call last) ────╮`` of ``│ /path/file.py:281 in save_file │``
  lines, a long path broken over two box lines);
* **pytest** (``_pytest/_code/code.py`` ``ReprEntry`` / ``ReprFileLocation``: a failure's
  ``____ test_name ____`` header; ``--tb=short`` frames ``path.py:42: in func`` over their
  code line; ``--tb=long`` (the default for the first and last entry) the function's source
  with ``>`` at the failing line, then its location ``path.py:42: `` or, for the last entry,
  ``path.py:42: TypeError``, the function's name taken from the ``def`` line above it; the
  exception and its message on ``E   `` lines; ``_ _ _`` separators between entries).

IPython's header names the exception before the frames; a paste cut before the exception
line still shows it, so the header keeps it: ``Traceback (most recent call last):
(OutOfMemoryError)`` (the shape of DCP's ``(RANK n)`` sub-headers). A frame whose line
number the rendering does not give becomes ``line 0``. A traceback's
header written behind other text on its line (``Saving checkpoint... Traceback (most recent
call last):``: a ``print(..., end="")``, a progress bar updated in place) starts a line of
its own, at the byte offset where it begins in the line. The rewritten
text is what the rules and the evidence see; nothing else of the line changes.
"""

from __future__ import annotations

import polars as pl

#: IPython's header: the exception's name, padding, then the usual words (no colon)
_IPY_HEADER = r"^([A-Za-z_][\w.]*)\s{2,}Traceback \(most recent call last\)\s*$"
_IPY_CELL = r"^Cell In ?\[(\d+)\], line (\d+)\s*$"
#: IPython 8: ``File <path>:<n>, in <func>(<args>)`` (no quotes: CPython's has them)
_IPY_FILE = r"^File ([^\"\s][^\n]*?):(\d+), in ([^(\n]+?)\s*(?:\(.*)?$"
#: IPython 7: ``<path> in <func>(<args>)``
_IPY7_FILE = r"^((?:[A-Za-z]:|~)?[/\\][^\s]*?\.py|<ipython-input-[\w-]+>) in ([^(\n]+?)\s*(?:\(.*)?$"
#: Colab: ``[<path>](<link>) in <func>(<args>)``
_COLAB_FILE = r"^\[([^\]\s]+?)\]\([^)]*\) in ([^(\n]+?)\s*(?:\(.*)?$"
_COLAB_HIDDEN = r"^(\d+) frames?\s*$"
#: IPython's code lines: ``----> 2 code``, ``-> 1298 code`` (the arrow marks the frame's line)
_IPY_ARROW = r"^-*> ?(\d+ )"
#: markers that a file holds IPython / Colab tracebacks (the context rewrites are tied to them)
_IPY_MARK = _IPY_HEADER + r"|^Cell In ?\[\d+\]|^<ipython-input-|\]\(https?://localhost[:\d]*/#\) in "

_RICH_TOP = r"^╭─+ ?Traceback \(most recent call last\) ?─+╮\s*$"
_RICH_BOTTOM = r"^╰─+╯\s*$"
_RICH_LINE = r"^│(.*?)│?\s*$"
#: ``│ /path/file.py:281 in save_file   │``
_RICH_FRAME = r"^│ ((?:[A-Za-z]:)?\S+?):(\d+) in ([\w.<>]+)\s*│?\s*$"
#: a path too long for the box: ``│ /path/to/accelerate_cli.py: │`` then ``│ 45 in main │``
_RICH_PATH_ONLY = r"^│ ((?:[A-Za-z]:)?\S+?):\s*│?\s*$"
_RICH_REST = r"^│ (\d+) in ([\w.<>]+)\s*│?\s*$"
#: ... or its function: ``│ /path/accelerator.py:2957 in │`` then ``│ save_state │``
_RICH_IN_ONLY = r"^│ ((?:[A-Za-z]:)?\S+?):(\d+) in\s*│?\s*$"
_RICH_FUNC = r"^│ ([A-Za-z_<][\w.<>]*)\s*│?\s*$"

#: pytest's failure header ``_____ test_save _____`` and its ``_ _ _`` entry separator
_PYTEST_HEADER = r"^_{3,} \S.* _{3,}\s*$"
_PYTEST_SEP = r"^(?:_ ){3,}_?\s*$"
#: ``--tb=short``: ``src/trainer.py:230: in save_checkpoint``
_PYTEST_SHORT = r"^([^\s:][^:\n]*\.py):(\d+): in ([\w.<>]+)\s*$"
#: ``--tb=long``: the entry's location after its source, the exception's name on the last one
_PYTEST_LOC = r"^([^\s:][^:\n]*\.py):(\d+):(?: (?:[A-Za-z_][\w.]*)?)?\s*$"
_PYTEST_DEF = r"^ *(?:async\s+)?def\s+(\w+)\s*\("
_PYTEST_ARROW = r"^>( +)"
_PYTEST_E = r"^E {3,}"
#: ``--tb=long``'s local variables above an entry's source (``tmp_path = PosixPath('…')``)
_PYTEST_LOCAL = r"^[A-Za-z_]\w* = \S"


_TB = "Traceback (most recent call last)"


def split_headers(df: pl.DataFrame, *, by: str | None = None, text_col: str = "line") -> pl.DataFrame:
    """``df`` (``offset`` and ``text_col`` per line, file order) with every traceback header
    that stands behind other text on its line moved to a line of its own (offset: the line's
    plus the header's byte position in the text), so that the record it starts is grouped
    and read as a traceback. IPython's and Rich's headers (a name or a box in front of the
    words, by design) are left alone."""
    line = pl.col(text_col)
    mid = (line.str.contains(_TB, literal=True) & ~line.str.strip_chars_start().str.starts_with(_TB)
           & ~line.str.contains(_IPY_HEADER) & ~line.str.contains(r"^[╭│]"))
    if df.is_empty() or not df.select(mid.any()).item():
        return df
    parts = df.filter(mid)
    halves = parts.select(line.str.split_exact(_TB, 1).alias("_h")).unnest("_h")
    before = parts.with_columns(halves["field_0"].str.strip_chars_end().alias(text_col))
    after = parts.with_columns(pl.concat_str([pl.lit(_TB), halves["field_1"]]).alias(text_col),
                               (pl.col("offset") + line.str.find(_TB, literal=True)).alias("offset"))
    order = [by, "offset"] if by else ["offset"]
    return pl.concat([df.filter(~mid), before, after]).sort(order, maintain_order=True)


def normalize(df: pl.DataFrame, *, by: str | None = None, text_col: str = "line") -> pl.DataFrame:
    """``df`` with the lines of IPython, Colab and Rich tracebacks in ``text_col`` rewritten
    to CPython's shape (see the module docstring). ``by``: a column telling files apart
    (rows of one file contiguous, in file order): the context-dependent rewrites (code
    lines, collapsed frames, a Rich path broken over two lines) apply only in files that
    hold such a traceback. Other columns are untouched; so is a batch with none."""
    if df.is_empty():
        return df
    df = split_headers(df, by=by, text_col=text_col)
    line = pl.col(text_col)
    marks = df.select(line.str.contains(_IPY_MARK).any().alias("ipy"),
                      line.str.contains(r"^╭─+ ?Traceback").any().alias("rich"),
                      (line.str.contains(_PYTEST_SHORT) | line.str.contains(_PYTEST_E)).any().alias("pytest"),
                      ).row(0, named=True)
    if not marks["ipy"] and not marks["rich"] and not marks["pytest"]:
        return df

    def per_file(e: pl.Expr) -> pl.Expr:
        return e.over(by) if by else e

    out = df
    if marks["ipy"]:
        in_ipy = per_file(line.str.contains(_IPY_MARK).any())
        out = out.with_columns(
            pl.when(line.str.contains(_IPY_HEADER)).then(line.str.replace(_IPY_HEADER, "Traceback (most recent call last): ($1)"))
            .when(line.str.contains(_IPY_CELL)).then(line.str.replace(_IPY_CELL, '  File "<cell $1>", line $2, in <module>'))
            .when(line.str.contains(_IPY_FILE)).then(line.str.replace(_IPY_FILE, '  File "$1", line $2, in $3'))
            .when(in_ipy & line.str.contains(_IPY7_FILE)).then(line.str.replace(_IPY7_FILE, '  File "$1", line 0, in $2'))
            .when(in_ipy & line.str.contains(_COLAB_FILE)).then(line.str.replace(_COLAB_FILE, '  File "$1", line 0, in $2'))
            .when(in_ipy & line.str.contains(_COLAB_HIDDEN)).then(line.str.replace(_COLAB_HIDDEN, "    [$1 frames hidden]"))
            .when(in_ipy & line.str.contains(_IPY_ARROW)).then(line.str.replace(_IPY_ARROW, "    $1"))
            .otherwise(line).alias(text_col))
    if marks["rich"]:
        nxt = per_file(line.shift(-1))
        prev = per_file(line.shift(1))
        split_path = line.str.contains(_RICH_PATH_ONLY) & nxt.str.contains(_RICH_REST).fill_null(False)
        joined = pl.concat_str([pl.lit('  File "'), line.str.extract(_RICH_PATH_ONLY, 1), pl.lit('", line '),
                                nxt.str.extract(_RICH_REST, 1), pl.lit(", in "), nxt.str.extract(_RICH_REST, 2)])
        rest_of_split = line.str.contains(_RICH_REST) & prev.str.contains(_RICH_PATH_ONLY).fill_null(False)
        split_func = line.str.contains(_RICH_IN_ONLY) & nxt.str.contains(_RICH_FUNC).fill_null(False)
        joined_func = pl.concat_str([pl.lit('  File "'), line.str.extract(_RICH_IN_ONLY, 1), pl.lit('", line '),
                                     line.str.extract(_RICH_IN_ONLY, 2), pl.lit(", in "), nxt.str.extract(_RICH_FUNC, 1)])
        func_of_split = line.str.contains(_RICH_FUNC) & prev.str.contains(_RICH_IN_ONLY).fill_null(False)
        in_rich = per_file(line.str.contains(_RICH_TOP).cum_max())
        out = out.with_columns(
            pl.when(line.str.contains(_RICH_TOP)).then(pl.lit("Traceback (most recent call last):"))
            .when(~in_rich).then(line)
            .when(line.str.contains(_RICH_BOTTOM)).then(pl.lit(""))
            .when(split_path).then(joined)
            .when(rest_of_split).then(pl.lit(""))
            .when(split_func).then(joined_func)
            .when(func_of_split).then(pl.lit(""))
            .when(line.str.contains(_RICH_FRAME)).then(line.str.replace(_RICH_FRAME, '  File "$1", line $2, in $3'))
            .when(line.str.contains(_RICH_LINE)).then(pl.concat_str([pl.lit("    "), line.str.extract(_RICH_LINE, 1)
                                                                      .str.strip_chars()]))
            .otherwise(line).alias(text_col))
    if marks["pytest"]:
        out = _pytest(out, line, per_file, text_col)
    return out


def _pytest(df: pl.DataFrame, line: pl.Expr, per_file, text_col: str) -> pl.DataFrame:
    """pytest's renderings rewritten to CPython's (module docstring), in files holding an
    ``E   `` exception line or a short frame: the ``E`` lines lose their marker (the first
    is the exception line, the rest its message, indented), a long entry's location becomes
    its frame, named by the ``def`` above it."""
    in_pytest = per_file(line.str.contains(_PYTEST_E).any() | line.str.contains(_PYTEST_SHORT).any())
    is_e = line.str.contains(_PYTEST_E)
    first_e = is_e & ~per_file(is_e.shift(1)).fill_null(False)
    func = per_file(line.str.extract(_PYTEST_DEF, 1).forward_fill()).fill_null("<unknown>")
    return df.with_columns(
        pl.when(~in_pytest).then(line)
        .when(line.str.contains(_PYTEST_HEADER)).then(pl.lit("Traceback (most recent call last):"))
        .when(line.str.contains(_PYTEST_SEP)).then(pl.lit(""))
        .when(line.str.contains(_PYTEST_SHORT)).then(line.str.replace(_PYTEST_SHORT, '  File "$1", line $2, in $3'))
        .when(line.str.contains(_PYTEST_LOC)).then(pl.concat_str([
            pl.lit('  File "'), line.str.extract(_PYTEST_LOC, 1), pl.lit('", line '),
            line.str.extract(_PYTEST_LOC, 2), pl.lit(", in "), func]))
        .when(first_e).then(line.str.replace(_PYTEST_E, ""))
        .when(is_e).then(line.str.replace(_PYTEST_E, "    "))
        .when(line.str.contains(_PYTEST_ARROW)).then(line.str.replace(_PYTEST_ARROW, " $1"))
        .when(line.str.contains(_PYTEST_LOCAL)).then(pl.concat_str([pl.lit("    "), line]))
        .otherwise(line).alias(text_col))
