"""Ingest: files -> source records.

One module per hard problem of tailing (the shape of Vector's file source):

* :mod:`.identity`   what identifies a file (so renames and inode reuse don't fool us) (fingerprinter)
* :mod:`.reader`     reading complete lines from an offset; binary files, huge lines, bad UTF-8
* :mod:`.discovery`  which files exist under the given paths, directories and globs (paths_provider)
* :mod:`.layout`     labels from the path (torchrun's ``--log-dir`` layout, user templates)
* :mod:`.prefix`     labels from line prefixes (``[default2]:``, ``[rank3]:``)
* :mod:`.multiline`  tracebacks and torchrun failure blocks -> one record
* :mod:`.timestamps` event time, UTC
* :mod:`.tail`       the per-file state that ties them together, batch by batch (file_watcher)
* :mod:`.rotation`   recognizing a ``copytruncate`` copy of a truncated file
* :mod:`.checkpoint` where each source resumes after a restart, saved atomically (checkpointer)
* :mod:`.watcher`    every file under the paths, through rotation and restarts (file_server)
* :mod:`.handles`    how many files are held open at once (the open-file limit)
* :mod:`.stats`      the run's counters
"""
