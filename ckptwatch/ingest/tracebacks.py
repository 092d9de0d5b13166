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
  lines, a long path broken over two box lines).

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
                      line.str.contains(r"^╭─+ ?Traceback").any().alias("rich")).row(0, named=True)
    if not marks["ipy"] and not marks["rich"]:
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
    return out
