"""Issue 14: the secret shapes the attack report found unredacted, and redaction of long and
adversarial lines (correct output; the speed is measured by ``benchmarks/redact.py``)."""

from __future__ import annotations

import pytest

from ckptwatch.sinks.redact import MAX_FIELD_CHARS, Redactor

REDACTOR = Redactor.load()
MIB = 1 << 20

SIG = "fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024"
GOOG_SIG = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9"


@pytest.mark.parametrize("line, redacted", [
    (f"GET https://b.s3.amazonaws.com/ckpt/iter_40.pt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential="
     f"AKIAIOSFODNN7EXAMPLE%2F20261130%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20261130T102121Z&"
     f"X-Amz-Expires=3600&X-Amz-Security-Token=FwoGZXIvYXdzEJrHUNTER2TOKEN&X-Amz-Signature={SIG} 403",
     "GET https://b.s3.amazonaws.com/ckpt/iter_40.pt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=[REDACTED]&"
     "X-Amz-Date=20261130T102121Z&X-Amz-Expires=3600&X-Amz-Security-Token=[REDACTED]&X-Amz-Signature=[REDACTED] 403"),
    (f"gs signed url https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Signature={GOOG_SIG}",
     "gs signed url https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Signature=[REDACTED]"),
    ("azure: https://acct.blob.core.windows.net/c/ckpt.pt?sv=2022-11-02&sp=r&se=2026-12-01T00%3A00Z"
     "&sig=Zm9vYmFyYmF6cXV4MTIz%2BNTY3ODkw%3D failed",
     "azure: https://acct.blob.core.windows.net/c/ckpt.pt?sv=2022-11-02&sp=r&se=2026-12-01T00%3A00Z"
     "&sig=[REDACTED] failed"),
    ("request headers: Authorization: Basic dXNlcjpodW50ZXIyaHVudGVyMg==",
     "request headers: Authorization: Basic [REDACTED]"),
    ("{'Authorization': 'Basic dXNlcjpodW50ZXIyaHVudGVyMg==', 'Host': 'minio'}",
     "{'Authorization': 'Basic [REDACTED]', 'Host': 'minio'}"),
    ("git clone https://x-access-token:ghs_16C7e42F292c6912E7710c838347Ae178B4a@github.com/o/r",
     "git clone https://x-access-token:[REDACTED]@github.com/o/r"),
    ("GITHUB_TOKEN ghs_16C7e42F292c6912E7710c838347Ae178B4a used",
     "GITHUB_TOKEN [REDACTED-TOKEN] used"),
    ("tokens: gho_16C7e42F292c6912E7710c838347Ae178B4a ghu_16C7e42F292c6912E7710c838347Ae178B4a "
     "ghr_16C7e42F292c6912E7710c838347Ae178B4a github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
     "tokens: [REDACTED-TOKEN] [REDACTED-TOKEN] [REDACTED-TOKEN] [REDACTED-TOKEN]"),
    ("cache at redis://:hunter2redis@cache.internal:6379/0 unreachable",
     "cache at redis://:[REDACTED]@cache.internal:6379/0 unreachable"),
    ('config: secret_key = "abc def ghi" region = "us-east-1"',
     'config: secret_key = "[REDACTED]" region = "us-east-1"'),
    ("aws_secret_access_key = 'wJalrXUtnFEMI/K7MDENG/bPxRfiCY' profile=x",
     "aws_secret_access_key = '[REDACTED]' profile=x"),
    ('{"password": "p w d", "api_key" : "k-123", "token":"t0k3n"}',
     '{"password": "[REDACTED]", "api_key" : "[REDACTED]", "token":"[REDACTED]"}'),
    ("secret_access_key: wJalrXUtnFEMI", "secret_access_key: [REDACTED]"),
    ("upload to s3://ckpt:p@ss@w0rd@bucket/run1/iter_40 failed",
     "upload to s3://ckpt:[REDACTED]@bucket/run1/iter_40 failed"),
])
def test_secret_shapes_of_the_attack_report_are_redacted(line, redacted):
    assert REDACTOR.redact(line) == redacted
    assert REDACTOR.redact(redacted) == redacted  # idempotent: the alert path may redact twice


@pytest.mark.parametrize("line", [
    "NCCL INFO Using network Socket; comm 0x55d1 rank 0 nranks 4 cudaDev 0 busId 1a000",
    "see https://pytorch.org/docs/stable/distributed.html#torch.distributed.barrier for details",
    "MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 torchrun --nnodes 2",
    "basic checks passed; signal handlers installed (sig=15 ignored)",
    "tokenizer has 32000 tokens; max_tokens: 512; secrets_dir unset",
    "http://localhost:8265/api/jobs/raysubmit_abc is running",
    "loss=2.3512 lr=3e-4 grad_norm=1.02 step=40/1000",
])
def test_ordinary_log_lines_are_kept(line):
    assert REDACTOR.redact(line) == line


def test_every_packaged_pattern_has_a_literal_prefilter_that_its_examples_pass():
    for p in REDACTOR.patterns:
        assert p.prefilter, p.id
        for line, _ in p.examples:
            assert any(lit in line.casefold() for lit in p.prefilter), (p.id, line)


@pytest.mark.parametrize("filler", ["a", "_", "-", "=", ":", "@", "a.", "/", "://", "password", "x-amz-",
                                    "s3://u:", "-----BEGIN PRIVATE KEY-----"])
def test_a_one_mib_adversarial_line_is_redacted_correctly(filler):
    """1 MiB of one adversarial pattern, a secret in the middle and at the end: both are
    redacted and nothing else changes."""
    half = filler * (MIB // 2 // len(filler))
    line = f"{half} password=hunter2 {half} url=https://u:pw9secret@store.internal/x"
    out = REDACTOR.redact(line)
    if filler.startswith("-----BEGIN"):  # an unterminated key block swallows the rest: redacted to the end
        assert out == "[REDACTED PRIVATE KEY]"
        return
    assert "hunter2" not in out and "pw9secret" not in out
    assert out.endswith(" url=https://u:[REDACTED]@store.internal/x")
    assert out.count("[REDACTED]") == 2, out[-200:]
    assert out.startswith(half[:1000])


def test_a_secret_at_the_end_of_a_one_mib_ordinary_line_is_redacted():
    line = "step 40 loss 2.35 " * (MIB // 18) + "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMIK7MDENG"
    out = REDACTOR.redact(line)
    assert out == line[: -len("wJalrXUtnFEMIK7MDENG")] + "[REDACTED]"


def test_strings_sent_in_alerts_are_redacted_then_cut_with_a_marker():
    big = "password=hunter2 " + "x" * MIB + " token=tail-secret"
    out = REDACTOR.field(big)
    red = REDACTOR.redact(big)
    assert len(out) == MAX_FIELD_CHARS and "hunter2" not in out and "tail-secret" not in out
    keep = out.index("… [cut: ")
    assert out == red[:keep] + f"… [cut: {len(red) - keep} more characters]"
    assert out.startswith("password=[REDACTED] xxx")
    assert REDACTOR.field("short line") == "short line"


def test_tree_redacts_every_string_at_any_depth_keys_included():
    doc = {"a": ["password=x1", {"deep": ("token=x2",), "n": 3, "ok": None}],
           "api_key=x3": "s3://u:x4@bucket/k", "f": 1.5, "b": True}
    out = REDACTOR.tree(doc)
    assert out == {"a": ["password=[REDACTED]", {"deep": ["token=[REDACTED]"], "n": 3, "ok": None}],
                   "api_key=[REDACTED]": "s3://u:[REDACTED]@bucket/k", "f": 1.5, "b": True}
