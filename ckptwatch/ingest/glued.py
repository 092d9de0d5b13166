"""Log records glued behind a progress bar, split back onto lines of their own, vectorized.

tqdm redraws its bar with a carriage return and no newline (``tqdm.std.tqdm.display``:
``\\r`` + the bar); the next line any logger writes to the same terminal then begins right
after the bar's last ``]``. A console keeps the ``\\r`` (the reader splits there), but a paste
into an issue thread loses it, and the record behind the bar is one line with it:

    ``  5%|▍   | 200/4443 [11:11:27<255:23:04, 216.68s/it]W0613 07:54:19.850000 180275 api.py:897] Sending …``

Its prefix (glog's level and time above, a timestamp, a rank label) is then not at the line's
start, so neither the launcher-prefix reader nor the rules see it, and the bar's step is lost
with it. :func:`split_glued` cuts such a line after the bar, at the byte offset where the
record begins (the bar keeps the line's offset), when what follows the bar starts like a
record: a glog / absl header, an ISO-8601 or ``YYYY/MM/DD`` time, a ``[rankN]:`` label, a
logging level word followed by a colon or a bracket, a traceback's header, or the shell's
word for the signal its job died of (``Killed``: bash prints it on the line the bar left).
"""

from __future__ import annotations

import polars as pl

#: tqdm's bar tail: ``n/total [elapsed<remaining, rate]`` (rate ``it/s``, ``s/it``, ``?it/s``,
#: any unit, with postfix ``, loss=…`` inside the brackets)
_BAR = r"\d+/\d+ \[[^\]\n]*?(?:/s|/it|s/\w+|\?\w+/s)[^\]\n]*\]"
#: what starts a record (see the module docstring)
_RECORD = (r"(?:[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d+\s|\[?\d{4}[-/]\d{2}[-/]\d{2}[ T]\d{2}:\d{2}:\d{2}"
           r"|\[rank\d+\]:|(?:INFO|WARNING|WARN|ERROR|CRITICAL|FATAL|DEBUG)(?::|\s*\]|\s+\d)"
           r"|Traceback \(most recent call last\)"
           r"|(?:Killed|Terminated|Aborted|Segmentation fault|Bus error)(?: \(core dumped\))?\s*$)")
_GLUED = rf"^(.*?{_BAR})\s*({_RECORD}.*)$"


def split_glued(df: pl.DataFrame, *, by: str | None = None, text_col: str = "line") -> pl.DataFrame:
    """``df`` (``offset`` and ``text_col`` per line, file order; other columns kept) with
    every record glued behind a tqdm bar moved to a line of its own: the bar keeps the line's
    offset, the record gets the offset plus its byte position in the line. A batch without
    such a line is returned as it is. ``by``: a column telling files apart, kept in order."""
    line = pl.col(text_col)
    glued = line.str.contains(_GLUED)
    if df.is_empty() or not df.select(glued.any()).item():
        return df
    parts = df.filter(glued)
    bar = line.str.extract(_GLUED, 1)
    record = line.str.extract(_GLUED, 2)
    before = parts.with_columns(bar.alias(text_col))
    after = parts.with_columns(record.alias(text_col),
                               (pl.col("offset") + line.str.len_bytes() - record.str.len_bytes()).alias("offset"))
    order = [by, "offset"] if by else ["offset"]
    return pl.concat([df.filter(~glued), before, after]).sort(order, maintain_order=True)
