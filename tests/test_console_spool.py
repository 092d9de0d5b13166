"""The console's uploads as the pipeline reads them (ckptwatch.ui.diagnose): each spooled
file is given to the pipeline by path, so it is read whatever its suffix (``metrics.json``
is diagnosed, and keeps its name) with no tie to discovery's skip list; names stay inside
the spool and distinct, keeping the file name that labels it (``console.log``); and a
refusal always says why (no empty UploadError as a signal)."""

from __future__ import annotations

import gzip
import os

import pytest
from kafka_support import failing_save

from ckptwatch.ui.diagnose import Limits, Upload, UploadError, prepare, run_diagnosis


def test_an_upload_is_read_whatever_its_suffix_and_keeps_its_name(tmp_path):
    save = failing_save("job-a")  # rank 1 fails step 30 with ENOSPC; rank 0's lines name the job nowhere
    d = run_diagnosis([Upload("rank0.log", save["rank0.log"].encode()),
                       Upload("metrics.json", save["rank1.log"].encode())], isolate=False)
    assert d.read == ["rank0.log", "metrics.json"]
    assert [(i.kind, i.step, i.root_cause.rank) for i in d.incidents] == [("storage_failure_during_save", 30, 1)]
    assert d.stats["lines"] == 8

    d = run_diagnosis([Upload("train.log.json.gz", gzip.compress((save["rank0.log"] + save["rank1.log"]).encode()))],
                      isolate=False)
    assert d.read == ["train.log.json"]
    assert [(i.kind, i.step) for i in d.incidents] == [("storage_failure_during_save", 30)]


def test_spooled_names_stay_in_the_spool_distinct_and_labelled(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    names = ["../escape.log", "../../../etc/cron.d/x", "..\\..\\win.log", "/abs/path.log", "..", ".hidden.log",
             "node1/console.log", "node2/console.log", "node3/console.log", "2", "a b$(id).log", "x.log.gz"]
    written, refused = prepare([Upload(n, b"a line\n") for n in names], str(spool), Limits())
    assert refused == {}
    # the second and third console.log keep their name (a torchrun console's), one directory
    # down; a file named "2" cannot be the directory "2" (nor the other way round)
    assert written == ["escape.log", "x", "win.log", "path.log", "pasted.log", "_.hidden.log",
                       "console.log", "2/console.log", "3/console.log", "2/2", "a_b__id_.log", "x.log"]
    on_disk = sorted(os.path.relpath(os.path.join(d, f), spool) for d, _, fs in os.walk(spool) for f in fs)
    assert on_disk == sorted(written)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spool"]  # nothing written beside the spool
    (tmp_path / "other").mkdir()
    assert prepare([Upload(n, b"a line\n") for n in ("2", "a.log", "a.log")], str(tmp_path / "other"),
                   Limits())[0] == ["2", "a.log", "3/a.log"]
    assert all(os.stat(spool / n).st_mode & 0o777 == 0o600 for n in written)


def test_over_the_cap_says_why_and_an_upload_error_always_does(tmp_path):
    limits = Limits(text_bytes=1 << 20)
    text = b"x\n" * 600_000  # 1.2 MB
    for i, u in enumerate((Upload("big.log", text), Upload("big.log.gz", gzip.compress(text)))):
        spool = tmp_path / str(i)
        spool.mkdir()
        with pytest.raises(UploadError, match=r"^more than 1 MiB of text once unpacked: at most that here"):
            prepare([Upload("small.log", b"a line\n"), u], str(spool), limits)
    with pytest.raises(ValueError, match="its message is empty"):
        UploadError("")
