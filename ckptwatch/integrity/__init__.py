"""Checkpoint integrity: manifests on save, verification before resume.

Works on the files alone, without torch: SHA-256 manifests (:mod:`.manifest`), structural
checks of each format (:mod:`.formats`), a verdict per file and per checkpoint
(:mod:`.verify`), and the one-line API for training scripts (:mod:`.api`).
"""
