"""Rotation while lines are being written, through the real broker: rename + create and
copytruncate, each in the middle of a collector's run. Every line reaches DuckDB once."""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest
from kafka_support import ckptwatch, cli_env, expected_lines, fresh_config, save_lines, stored_lines

pytestmark = pytest.mark.kafka


def shift(log):
    """logrotate with ``rotate N``: older generations move up one (.1 -> .2) first."""
    if os.path.exists(f"{log}.1"):
        os.rename(f"{log}.1", f"{log}.2")


def rotate_rename(log):
    shift(log)
    os.rename(log, f"{log}.1")  # logrotate's default: the writer reopens a new file


def rotate_copytruncate(log):
    # logrotate copytruncate: copy, then truncate in place; the writer keeps its fd (O_APPEND).
    # The test holds the writer's lock across both, so logrotate's own race (lines written
    # between the copy and the truncate are lost by logrotate) is not what is measured.
    shift(log)
    shutil.copyfile(log, f"{log}.1")
    with open(log, "r+") as f:
        f.truncate(0)


# rename through the broker: `make test-slow` (CI's soak round rotates both ways through it, and
# test_rotation_copies covers renames against the real broker); copytruncate, the harder, here
@pytest.mark.parametrize("rotate", [pytest.param(rotate_rename, marks=pytest.mark.slow), rotate_copytruncate])
def test_rotation_while_writing(rotate, kafka_bootstrap, tmp_path):
    logdir = tmp_path / "logs" / "job-rotate"
    logdir.mkdir(parents=True)
    log = logdir / "rank0.log"
    log.write_text("")
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=2)
    env = cli_env(cfg, CKPTWATCH_COLLECT_PATH_TEMPLATE="{job}/rank{rank}.log")
    total, chunk, rotations = 3000, 50, (1000, 2000)
    lock = threading.Lock()

    def writer():
        f = open(log, "a")
        for first in range(0, total, chunk):
            with lock:
                if first in rotations:
                    rotate(str(log))
                    if rotate is rotate_rename:
                        f.close()
                        f = open(log, "a")
                f.write(save_lines(first, chunk))
                f.flush()
            time.sleep(0.02)
        f.close()

    # the collector watches only the live name, as a glob: a rotated file must still be
    # drained (rename) or recognized as a copy and not re-read (copytruncate)
    collector = ckptwatch(["collect", str(tmp_path / "logs" / "*" / "*.log"), "--until-idle", "4"], env)
    deadline = time.monotonic() + 60
    while not os.path.exists(cfg.collect.checkpoint):  # its first poll is done: it follows the file
        assert time.monotonic() < deadline and collector.poll() is None, collector.communicate()[1]
        time.sleep(0.1)
    t = threading.Thread(target=writer)
    t.start()
    t.join()
    _, err = collector.communicate(timeout=120)
    assert collector.returncode == 0, err
    sink = ckptwatch(["sink", "--until-idle", "4"], env)
    _, serr = sink.communicate(timeout=120)
    assert sink.returncode == 0, serr
    assert stored_lines(cfg.sink.db) == expected_lines(total)
