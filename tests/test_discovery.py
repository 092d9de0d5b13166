"""Which files a directory gives (ckptwatch.ingest.discovery), and that a poll reads only the
files that changed."""

from __future__ import annotations

import os

from ckptwatch.ingest import discovery
from ckptwatch.ingest.tail import FileTail
from ckptwatch.ingest.watcher import SourceWatcher


def test_a_directory_walk_lists_files_once_sorted_without_hidden_skipped_or_symlinked_dirs(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    (tmp_path / ".hidden").mkdir()
    for rel in ("z.log", "a/rank1.log", "a/rank0.log", "b/x.log", ".hidden/h.log", "a/.dot.log", "a/model.pt"):
        (tmp_path / rel).write_text("x\n")
    (tmp_path / "a" / "old.log.1.gz").write_bytes(b"")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "e.log").write_text("x\n")
    (tmp_path / "b" / "link-dir").symlink_to(tmp_path / "elsewhere")  # not walked
    (tmp_path / "b" / "same.log").symlink_to(tmp_path / "z.log")  # the same file as z.log: once
    found = discovery.discover([str(tmp_path)])
    rel = [(os.path.relpath(f.path, tmp_path), f.archive) for f in found]
    assert rel == [("a/old.log.1.gz", True), ("z.log", False), ("a/rank0.log", False), ("a/rank1.log", False),
                   ("b/x.log", False), ("elsewhere/e.log", False)]


def test_a_poll_reads_only_the_files_that_changed(tmp_path, monkeypatch):
    for r in range(4):
        (tmp_path / f"rank{r}.log").write_text(f"[rank{r}]:step 1 loss 2.0\n")
    w = SourceWatcher([str(tmp_path)], flush_after=0.0)
    assert w.poll().height == 4
    reads: list[str] = []
    real_read = FileTail.read

    def counting_read(self, **kw):
        reads.append(os.path.basename(self.path))
        return real_read(self, **kw)

    monkeypatch.setattr(FileTail, "read", counting_read)
    assert w.poll().height == 0 and reads == []  # nothing changed: no file read
    with open(tmp_path / "rank2.log", "a") as f:
        f.write("[rank2]:step 2 loss 1.9\n")
    records = w.poll()
    assert reads == ["rank2.log"] and records["line"].to_list() == ["step 2 loss 1.9"]
    w.close()
