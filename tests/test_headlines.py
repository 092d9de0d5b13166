"""Issue 17, headlines: every incident kind's page names its most important fact.

For one real incident of each kind (the bundled corpus, real runs, the scenario library,
and the detector fed events for the kinds no bundled log holds), the headline is pinned
exactly, and every channel's rendering of it (PagerDuty ``summary``, Slack ``text`` and
its first section, the webhook ``summary``, the console report) carries it, with no
``None`` and no "cause unknown" anywhere in what a receiver is sent.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from ckptwatch.detectors.headline import cause_phrase, errno_of, headline
from ckptwatch.groundtruth import restore_mtimes
from ckptwatch.pipeline import diagnose
from ckptwatch.sinks import report
from ckptwatch.sinks.alerts import pagerduty, slack, webhook
from ckptwatch.sinks.alerts.notification_log import Notification
from ckptwatch.sinks.redact import Redactor

ROOT = Path(__file__).resolve().parents[1]
C02 = "/tmp/corpus-work/02-sigkill-mid-save/checkpoints/iter_00000"

#: (case folder under the repository, incident kind, step) -> the exact headline
EXPECTED = {
    ("examples/corpus/02-sigkill-mid-save/logs", "interrupted_save", 40):
        f"interrupted_save: job job-0201-sigkill: save of step 40 ({C02}40) cut off by SIGKILL (rank 2, host vm); "
        f"last good: step 20 ({C02}20)",
    ("examples/corpus/02-sigkill-mid-save/logs", "poisoned_resume", 40):
        f"poisoned_resume: job job-0202-resume-iter40: resumed from a bad checkpoint, step 40 ({C02}40): its save "
        f"was interrupted by SIGKILL (rank 2, host vm); last good: step 20 ({C02}20)",
    ("examples/corpus/02-sigkill-mid-save/logs", "load_failure", 40):
        f"load_failure: job job-0202-resume-iter40: loading step 40 ({C02}40) failed: missing_metadata; its save "
        f"was interrupted by SIGKILL (rank 2, host vm); last good: step 20 ({C02}20)",
    ("examples/corpus/03-collective-timeout/logs", "interrupted_save", 40):
        "interrupted_save: job job-0301-timeout: save of step 40 (/tmp/corpus-work/03-collective-timeout/checkpoints/"
        "step_0000040) cut off by a collective timeout: rank 1 stopped taking part (host vm); last good: step 20 "
        "(/tmp/corpus-work/03-collective-timeout/checkpoints/step_0000020)",
    ("tests/fixtures/realruns/hf-torchrun-enospc/logs", "storage_failure_during_save", 30):
        "storage_failure_during_save: job 60e67138-61ba-4503-8490-d256f4a5f273: save of step 30 (out/checkpoint-30) "
        "failed on storage: ENOSPC (rank 0); last good: step 20 (out/checkpoint-20)",
    ("tests/fixtures/realruns/hf-accelerate-enospc/logs", "storage_failure_during_save", 30):
        "storage_failure_during_save: job none_vee7_yat: save of step 30 (out/checkpoint-30) failed on storage: a "
        "short write in torch.save, as on a full disk (rank 0); last good: step 20 (out/checkpoint-20)",
    ("tests/fixtures/realruns/deepspeed-zero1-world-size-mismatch/logs", "world_size_mismatch", 20):
        "world_size_mismatch: job 2db98cde-d97d-49dd-b1e9-0c9fe89e01a7: step 20 (ckpt/global_step20) saved at world "
        "size 2, loaded at world size 1",
    ("tests/scenarios/megatron-regression/logs", "post_resume_regression", 40):
        "post_resume_regression: job gpt-0602-resume: after resuming from step 40 (/ckpt/gpt-345m/iter_0000040), "
        "median loss 1.859 before, 4.871 after",
}


@pytest.fixture(scope="module")
def real_incidents():
    restore_mtimes(ROOT)  # undated lines take their file's mtime, which a checkout loses
    out = {}
    for folder in sorted({f for f, _, _ in EXPECTED}):
        incidents, _ = diagnose([str(ROOT / folder)])
        for inc in incidents:
            out.setdefault((folder, inc.kind, inc.step), inc)
    return out


def _strings(obj) -> list[str]:
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in (str(k), *_strings(v))]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return [str(obj)] if isinstance(obj, str) else []


def _check_channels(inc, expected: str) -> None:
    """Every channel carries ``expected``; nothing a receiver is sent says None or cause unknown."""
    r = Redactor.load()
    assert headline(inc) == expected
    pd = pagerduty.trigger(inc, routing_key="K", redactor=r)
    assert pd["payload"]["summary"] == expected
    msg = slack.message(inc, redactor=r)
    assert msg["text"] == expected and msg["blocks"][1]["text"]["text"] == expected
    n = Notification(id=1, channel="hook", action="trigger", attempts=0, created_ts=inc.first_ts, incident=inc)
    body = json.loads(webhook.body(n, "hook", r))
    assert body["summary"] == expected
    for payload in (msg, pd["payload"]["summary"], body["summary"]):
        texts = _strings(payload) if not isinstance(payload, str) else [payload]
        assert not [t for t in texts if "None" in t.split() or "cause unknown" in t], texts
    for f in msg["blocks"][2]["fields"]:
        assert "None" not in f["text"].split(), f


@pytest.mark.parametrize("key", sorted(EXPECTED), ids=lambda k: f"{Path(k[0]).parent.name}-{k[1]}")
def test_each_kind_of_real_incident_pages_with_its_fact(real_incidents, key):
    assert key in real_incidents, sorted(real_incidents)
    _check_channels(real_incidents[key], EXPECTED[key])


def test_a_load_failure_without_step_or_path_says_so_in_words(real_incidents):
    incidents, _ = diagnose([str(ROOT / "examples/corpus/06-world-size-mismatch/logs")])
    inc = next(i for i in incidents if i.kind == "load_failure" and i.job == "job-06-b1-ws2-copy-local-shards")
    _check_channels(inc, "load_failure: job job-06-b1-ws2-copy-local-shards: loading a checkpoint whose step and "
                         "path were not logged failed: size_mismatch")
    text = slack.message(inc, redactor=Redactor.load())
    fields = [f["text"] for f in text["blocks"][2]["fields"]]
    assert fields[1:3] == ["*Step*\nnot logged", "*Checkpoint*\npath not logged"]
    # both ranks fail alike; rank 1's traceback is printed first, dated by its own line at
    # 10:26:18.525, rank 0's by its .591 one
    assert fields[4] == "*Why*\nsize_mismatch, first on rank 1"


def _detector_incident(events):
    from test_cause import run

    (inc,) = run(events)
    return inc


def test_partial_and_stalled_saves_name_the_ranks_that_never_finished():
    from test_cause import ev, saves, world

    events = world() + saves(40, 10) + saves(40, 12, ranks=(0, 1, 3), end=True)
    partial = _detector_incident(events + [ev("metric", 20, rank=r, step=41, loss=0.4) for r in (0, 1, 3)])
    _check_channels(partial, "partial_checkpoint: job job-a: checkpoint step 40 (/c/step_40) is partial: rank 2 "
                             "never finished writing; no earlier good checkpoint seen")
    events = world() + saves(40, 10) + saves(40, 12, ranks=(0, 1, 2), end=True)
    stalled = _detector_incident(events + [ev("world_size", 3600, rank=0, world_size=4)])
    _check_channels(stalled, "stalled_save: job job-a: save of step 40 (/c/step_40) has stalled: no end of save "
                             "from rank 3")


def test_a_corrupt_checkpoint_and_the_resume_from_it_name_what_verification_found(tmp_path):
    from test_integrity_events import _resume, _run, _saver, _verify

    _saver(tmp_path)
    (tmp_path / "verify").mkdir()
    _verify(tmp_path, 300, "corrupt")
    _resume(tmp_path, 400, "job-b")
    got = _run(tmp_path)
    from ckptwatch.detectors.incident import Incident

    cc, pr = Incident.from_dict(got["corrupt_checkpoint"]), Incident.from_dict(got["poisoned_resume"])
    _check_channels(cc, "corrupt_checkpoint: job verify: checkpoint step 40 (/ckpt/out/checkpoint-40): verification "
                        "found it corrupt: pytorch_model_fsdp_0/__1_0.distcp: hash_mismatch (1 problem(s) in 6 files); "
                        "last good: step 20 (/ckpt/out/checkpoint-20)")
    _check_channels(pr, "poisoned_resume: job job-b: resumed from a bad checkpoint, step 40 (/ckpt/out/checkpoint-40): "
                        "verification found it corrupt; last good: step 20 (/ckpt/out/checkpoint-20)")


def test_the_console_report_says_what_broke_a_checkpoint_without_a_root_cause(real_incidents):
    inc = real_incidents[("examples/corpus/02-sigkill-mid-save/logs", "poisoned_resume", 40)]
    out = io.StringIO()
    report.render_text([inc], Console(file=out, width=400, highlight=False))
    assert "  what broke   its save was interrupted by SIGKILL (rank 2, host vm)\n" in out.getvalue()


@pytest.mark.parametrize(("line", "name"), [
    ("OSError: [Errno 28] No space left on device", "ENOSPC"),
    ("OSError: [Errno 122] Disk quota exceeded", "EDQUOT"),
    ("OSError: [Errno 5] Input/output error", "EIO"),
    ("OSError: [Errno 116] Stale file handle", "ESTALE"),
    ("kernel: nfs: server filer-2 not responding, still trying", "nfs"),
    ("RuntimeError: shape mismatch", None),
])
def test_errno_names(line, name):
    assert errno_of(line) == name


def test_cause_phrases_name_the_sender_and_the_nfs_server():
    assert cause_phrase("signal", 3, "n1", "SIGTERM", "scheduler_time_limit") == \
        "SIGTERM from the scheduler's time limit (rank 3, host n1)"
    assert cause_phrase("storage_error", None, "n1", line="nfs: server filer-2 not responding, still trying") == \
        "NFS server filer-2 not responding (host n1)"
    assert cause_phrase("storage_error", 0, None, line="botocore.exceptions.ClientError: An error occurred "
                        "(SlowDown) when calling the PutObject operation") == "S3 throttling (SlowDown) (rank 0)"
    assert cause_phrase("oom_kill", 5, "gpu-3") == "the OOM killer (rank 5, host gpu-3)"
    assert cause_phrase("unknown") == "a failure not named in the logs read"


def test_a_storage_error_named_by_another_root_line_still_names_its_errno(real_incidents):
    """A new user's trial: the root cause's own line was a traceback's "During handling of
    the above exception" line, and the headline said only "a storage error"."""
    import dataclasses

    inc = real_incidents[("tests/fixtures/realruns/hf-torchrun-enospc/logs", "storage_failure_during_save", 30)]
    rc = dataclasses.replace(inc.root_cause, line="During handling of the above exception, another exception occurred:")
    ev = dataclasses.replace(inc.evidence[0], role="root_cause", line="OSError: [Errno 28] No space left on device")
    moved = dataclasses.replace(inc, root_cause=rc, evidence=[ev])
    assert "failed on storage: ENOSPC (rank 0)" in headline(moved)


def test_a_chained_traceback_names_its_exception_line_and_the_errno_after_it(tmp_path):
    """A second trial, as a user's loop logs it: the traceback of torch.save's short write
    ends with "During handling of the above exception" (a blank line splits the record), and
    the OSError with the errno comes as a record of its own. The root cause's line was the
    separator, and the headline said "a short write" though ENOSPC was in the evidence."""
    (tmp_path / "train-rank0.log").write_text(
        "2026-12-04 01:50:51,367 INFO  [mytrain] Saving checkpoint to /ck/checkpoint-10\n"
        "2026-12-04 01:50:51,567 INFO  [mytrain] Saved checkpoint /ck/checkpoint-10\n"
        "2026-12-04 01:50:51,567 INFO  [mytrain] step 20 loss 0.5\n"
        "2026-12-04 01:50:51,567 INFO  [mytrain] Saving checkpoint to /ck/checkpoint-20\n"
        "Traceback (most recent call last):\n"
        '  File "/tmp/train.py", line 37, in <module>\n'
        "    torch.save(state, path)\n"
        '  File "/usr/lib/python3/site-packages/torch/serialization.py", line 965, in save\n'
        "    with _open_zipfile_writer(f) as opened_zipfile:\n"
        "RuntimeError: [enforce fail at inline_container.cc:626] . unexpected pos 1472 vs 1366\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "OSError: [Errno 28] No space left on device\n")
    (inc,), _ = diagnose([str(tmp_path)])
    assert inc.root_cause.line == "RuntimeError: [enforce fail at inline_container.cc:626] . unexpected pos 1472 vs 1366"
    assert headline(inc) == (f"storage_failure_during_save: job {tmp_path.name}: save of step 20 (/ck/checkpoint-20) failed on "
                             "storage: ENOSPC (rank 0); last good: step 10 (/ck/checkpoint-10)")
