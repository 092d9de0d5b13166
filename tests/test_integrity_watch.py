"""The checkpoint watcher: a checkpoint is verified once it stops changing, once per
content, across restarts; `run --checkpoint-root` turns a damaged checkpoint into a
corrupt_checkpoint incident, embedded and through the real broker."""

from __future__ import annotations

import os
import time

import duckdb
import pytest
from integrity_support import DELETED, SHARD, copy_checkpoint, flip_middle_byte
from kafka_support import ckptwatch, cli_env, finish, fresh_config

from ckptwatch.integrity.watch import CheckpointWatcher


def integrity_lines(log) -> list[str]:
    return [line.split(" ckptwatch ", 1)[1] for line in log.read_text().splitlines()]


def test_verified_once_settled_once_per_content_and_not_again_after_restart(tmp_path):
    root = tmp_path / "ckpt"
    ckpt = copy_checkpoint(root / "checkpoint-60")
    (root / "not-a-checkpoint").mkdir()  # no step in its name: ignored
    log = tmp_path / "verify.log"
    w = CheckpointWatcher([str(root)], str(log), settle=30.0)
    (ckpt / "trainer_state.json").write_text('{"global_step": 60}')  # being written just now
    t = time.time()
    assert w.poll(wait=True, now=t) == 0  # modified 0 s ago: maybe a save in progress
    assert w.poll(wait=True, now=t + 29) == 0
    assert w.poll(wait=True, now=t + 31) == 1  # nothing changed for 30 s: settled
    w.close()
    lines = integrity_lines(log)
    assert len(lines) == 1 and lines[0].startswith("event=integrity step=60 verdict=ok files=15 ")

    w = CheckpointWatcher([str(root)], str(log), settle=0.0)  # a restart: the state file remembers
    assert w.poll(wait=True) == 0
    flip_middle_byte(ckpt / SHARD)
    (ckpt / SHARD).touch()
    assert w.poll(wait=True) == 1  # new content: verified again
    w.close()
    lines = integrity_lines(log)
    assert len(lines) == 2 and "verdict=corrupt" in lines[1] and f'detail="{SHARD}: crc_mismatch"' in lines[1]


def test_a_damaged_state_file_is_named(tmp_path):
    from ckptwatch.integrity.errors import IntegrityError

    (tmp_path / "verify.log.state.json").write_text("{not json")
    with pytest.raises(IntegrityError, match=r"verify\.log\.state\.json: damaged state .*delete it"):
        CheckpointWatcher([str(tmp_path)], str(tmp_path / "verify.log"))


def _damaged_roots(tmp_path):
    root = tmp_path / "ckpt"
    copy_checkpoint(root / "checkpoint-40")  # whole
    (copy_checkpoint(root / "checkpoint-60") / DELETED).unlink()
    hour_ago = time.time() - 3600  # saved a while ago: settled whatever the checkout's mtimes
    for f in root.rglob("*"):
        os.utime(f, (hour_ago, hour_ago))
    logs = tmp_path / "logs"
    logs.mkdir()
    return root, logs


def _stored(db) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT kind, step, checkpoint_path, status FROM incidents ORDER BY step").fetchall()
    finally:
        con.close()


def test_run_once_with_checkpoint_root_reports_the_incomplete_one(tmp_path):
    root, logs = _damaged_roots(tmp_path)
    db = tmp_path / "i.duckdb"
    out, err = finish(ckptwatch(["run", "--logs", str(logs), "--db", str(db), "--once", "--checkpoint-root", "ckpt"],
                                cli_env(fresh_config("", tmp_path)), cwd=tmp_path))  # a relative root: absolute paths
    assert _stored(db) == [("corrupt_checkpoint", 60, str(root / "checkpoint-60"), "open")]
    con = duckdb.connect(str(db), read_only=True)
    try:  # checkpoint-40 was verified ok: the way out
        assert con.execute("SELECT last_good_step, last_good_path FROM incidents").fetchall() == \
            [(40, str(root / "checkpoint-40"))]
    finally:
        con.close()
    assert f"{DELETED}: missing" in out
    lines = integrity_lines(tmp_path / "ckptwatch-verify.log")  # next to the database
    assert sorted(x.split(" verdict=")[1].split(" ")[0] for x in lines) == ["incomplete", "ok"]


@pytest.mark.kafka
def test_checkpoint_root_through_kafka(kafka_bootstrap, tmp_path):
    root, logs = _damaged_roots(tmp_path)
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=2)
    db = tmp_path / "k.duckdb"
    finish(ckptwatch(["run", "--kafka", kafka_bootstrap, "--logs", str(logs), "--db", str(db), "--once",
                      "--checkpoint-root", str(root)], cli_env(cfg)), timeout=180)
    assert _stored(db) == [("corrupt_checkpoint", 60, str(root / "checkpoint-60"), "open")]


def test_limits_come_from_the_collect_settings(tmp_path):
    from types import SimpleNamespace

    from ckptwatch.integrity.errors import IntegrityError

    def settings(**kw):
        return SimpleNamespace(checkpoint_roots=[str(tmp_path)], verify_log=str(tmp_path / "v.log"), verify_settle=1.0,
                               **kw)

    w = CheckpointWatcher.from_settings(settings(verify_limits=["max_zip_entries=10", "inflate_floor=1M"]))
    assert (w.limits.max_zip_entries, w.limits.inflate_floor, w.limits.max_tensors) == (10, 1 << 20, 200_000)
    w.close()
    w = CheckpointWatcher.from_settings(settings())  # settings without the field: the defaults
    assert w.limits.max_zip_entries == 262_144
    w.close()
    with pytest.raises(IntegrityError, match="verify_limits: nope=1: unknown limit"):
        CheckpointWatcher.from_settings(settings(verify_limits=["nope=1"]))
