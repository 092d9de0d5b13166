"""``ckptwatch detect --until-idle N`` takes the input as complete when idleness ends the run:
it concludes what waits for late evidence and publishes it before exiting, as the embedded
``run --once`` and ``diagnose`` do. A failure at the very end of the logs used to be left
unreported (its evidence waits ``settle`` seconds of watermark that never came)."""

from __future__ import annotations

import pytest
from kafka_support import ckptwatch, cli_env, finish, fresh_config, topic_messages

from ckptwatch.ingest.layout import compile_template
from ckptwatch.kafka.codec import decode_incident
from ckptwatch.pipeline import PipelineOptions, diagnose

pytestmark = pytest.mark.kafka

TEMPLATE = "{job}/rank{rank}.log"
T = "2026-11-30T08:0"
LOGS = {
    "rank0.log": [f"{T}0:00.000000Z ckptwatch event=save_start step=10 rank=0 world_size=2 path=/ckpt/job-a/step_10",
                  f"{T}0:02.000000Z ckptwatch event=save_end step=10 rank=0 world_size=2 files=2 bytes=4096 path=/ckpt/job-a/step_10",
                  f"{T}3:20.000000Z ckptwatch event=save_start step=30 rank=0 world_size=2 path=/ckpt/job-a/step_30",
                  f"{T}3:22.000000Z ckptwatch event=save_end step=30 rank=0 world_size=2 files=2 bytes=4096 path=/ckpt/job-a/step_30"],
    "rank1.log": [f"{T}0:00.001000Z ckptwatch event=save_start step=10 rank=1 world_size=2 path=/ckpt/job-a/step_10",
                  f"{T}0:02.001000Z ckptwatch event=save_end step=10 rank=1 world_size=2 files=2 bytes=4096 path=/ckpt/job-a/step_10",
                  f"{T}3:20.001000Z ckptwatch event=save_start step=30 rank=1 world_size=2 path=/ckpt/job-a/step_30",
                  f"{T}3:21.000000Z ERROR OSError: [Errno 28] No space left on device: '/ckpt/job-a/step_30/shard_1.pt'"],
}


def test_detect_until_idle_reports_a_failure_at_the_end_of_the_logs(kafka_bootstrap, tmp_path):
    logs = tmp_path / "logs"
    (logs / "job-a").mkdir(parents=True)
    for name, lines in LOGS.items():
        (logs / "job-a" / name).write_text("\n".join(lines) + "\n")
    expected = [(i.kind, i.step, i.root_cause.rank) for i in diagnose(
        [str(logs)], PipelineOptions(template=compile_template(TEMPLATE)))[0]]
    assert expected == [("storage_failure_during_save", 30, 1)]

    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=1)
    env = cli_env(cfg, CKPTWATCH_COLLECT_PATH_TEMPLATE=TEMPLATE)
    finish(ckptwatch(["collect", str(logs), "--once"], env, cwd=tmp_path))
    _, err = finish(ckptwatch(["detect", "--until-idle", "2"], env, cwd=tmp_path))
    published = [decode_incident(m.value) for m in topic_messages(kafka_bootstrap, cfg.kafka.incidents_topic)]
    assert [(i.kind, i.step, i.root_cause.rank) for i in published] == expected, err
    assert "1 incident versions published" in err
