"""ckptwatch: find interrupted, partial and poisoned checkpoints in ML training logs.

Stages (one folder each): ``ingest`` (files -> source records), ``rules`` (records ->
events), ``detectors`` (events -> incidents), ``sinks`` (incidents -> DuckDB, reports).
All timestamps are UTC internally.
"""

__version__ = "0.1.0"
