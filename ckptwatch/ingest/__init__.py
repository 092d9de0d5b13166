"""Ingest: files -> source records.

One module per hard problem of tailing (the shape of Vector's file source):

* :mod:`.identity`   what identifies a file (so renames and inode reuse don't fool us)
* :mod:`.reader`     reading complete lines from an offset; binary files, huge lines, bad UTF-8
* :mod:`.discovery`  which files exist under the given paths
* :mod:`.layout`     labels from the path (torchrun's ``--log-dir`` layout, user templates)
* :mod:`.prefix`     labels from line prefixes (``[default2]:``, ``[rank3]:``)
* :mod:`.multiline`  tracebacks and torchrun failure blocks -> one record
* :mod:`.timestamps` event time, UTC
* :mod:`.tail`       the per-file state that ties them together, batch by batch
"""
