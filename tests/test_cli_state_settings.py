"""How the long-running commands treat their own state: the files they create are private
(umask 077 at start, whatever the caller's umask), and ``--retention-days`` /
``[sink] retention_days`` reach the embedded runner that deletes old raw events."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckptwatch import cli, config

CORPUS = Path(__file__).parent / "fixtures" / "corpus"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_run_creates_its_files_private_under_a_permissive_umask(tmp_path):
    # the verification log is written by the checkpoint watcher, not by the store: only the
    # process-wide umask makes it private (it names checkpoint paths and findings)
    logs = tmp_path / "logs"
    shutil.copytree(CORPUS / "07-dcp-missing-shard", logs)
    db = tmp_path / "state" / "d.duckdb"
    db.parent.mkdir()
    proc = subprocess.run([sys.executable, "-m", "ckptwatch", "run", "--logs", str(logs), "--db", str(db), "--once",
                           "--checkpoint-root", str(logs / "artifacts")],
                          capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.umask(0o022))
    assert proc.returncode == 0, proc.stderr
    made = sorted(p.name for p in db.parent.iterdir())
    assert "d.duckdb" in made and "ckptwatch-verify.log" in made
    assert {p.name: _mode(p) for p in db.parent.iterdir()} == {name: 0o600 for name in made}


def test_retention_days_from_the_flag_overrides_the_config_file(tmp_path, monkeypatch):
    toml = tmp_path / "c.toml"
    toml.write_text("[sink]\nretention_days = 30\n")
    assert cli._retention(config.load(str(toml))) == dt.timedelta(days=30)
    assert cli._retention(config.load(None)) is None  # default: raw events are kept
    with pytest.raises(config.ConfigError, match="retention_days"):
        config.load(None, env={"CKPTWATCH_SINK_RETENTION_DAYS": "-1"})

    seen: list[dt.timedelta | None] = []
    from ckptwatch import embedded

    real_init = embedded.EmbeddedRunner.__init__

    def spy(self, *args, **kwargs):  # the real runner, recording what it was given
        seen.append(kwargs.get("retention"))
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(embedded.EmbeddedRunner, "__init__", spy)
    monkeypatch.setattr(os, "umask", lambda mask: 0o022)  # keep this test process's umask
    logs = tmp_path / "logs"
    # the example corpus's clean run (the fixture copy holds artifacts only: an empty run now exits 2)
    shutil.copytree(Path(__file__).parent.parent / "examples" / "corpus" / "01-clean", logs)
    args = ["run", "--logs", str(logs), "--once", "--config", str(toml)]
    for extra, want in [([], dt.timedelta(days=30)), (["--retention-days", "0.5"], dt.timedelta(hours=12)),
                        (["--retention-days", "0"], None)]:
        res = CliRunner().invoke(cli.app, args + ["--db", str(tmp_path / f"r{len(seen)}.duckdb")] + extra)
        assert res.exit_code == 0, res.output
        assert seen[-1] == want
    res = CliRunner().invoke(cli.app, args + ["--db", str(tmp_path / "x.duckdb"), "--retention-days", "-2"])
    assert res.exit_code == 2 and "--retention-days" in res.output


def test_state_and_delivery_settings_are_checked_where_they_are_read():
    cfg = config.load(None)
    assert (cfg.alerts.timeout, cfg.alerts.connect_timeout, cfg.collect.verify_limits) == (30.0, 5.0, [])
    cfg = config.load(None, env={"CKPTWATCH_COLLECT_VERIFY_LIMITS": "max_tensors=1k,max_json_bytes=2M"})
    assert cfg.collect.verify_limits == ["max_tensors=1k", "max_json_bytes=2M"]
    for key, value, reason in [("COLLECT_VERIFY_LIMITS", "max_bogus=1", "unknown limit"),
                               ("COLLECT_VERIFY_LIMITS", "max_tensors=-1", "not a non-negative integer"),
                               ("ALERTS_CONNECT_TIMEOUT", "0", "connect_timeout"),
                               ("SINK_RETENTION_DAYS", "1e9", "3650 days")]:
        with pytest.raises(config.ConfigError, match=reason):
            config.load(None, env={f"CKPTWATCH_{key}": value})


def test_a_one_shot_run_stopped_before_the_end_of_its_input_does_not_exit_0(tmp_path):
    # cron or CI must not read an interrupted `run --once` as done; a service's stop stays 0
    import signal
    import time

    log = tmp_path / "logs" / "job-a" / "rank0.log"
    log.parent.mkdir(parents=True)
    with open(log, "w") as f:
        for i in range(400_000):
            f.write(f"2026-11-30T10:00:00.{i % 1000:03d}Z ckptwatch event=save_start step={i} rank=0 world_size=1 "
                    f"path=/ckpt/s{i}\n")
    proc = subprocess.Popen([sys.executable, "-m", "ckptwatch", "run", "--logs", str(tmp_path / "logs"),
                             "--db", str(tmp_path / "d.duckdb"), "--once"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "d.duckdb").exists():  # started reading
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
