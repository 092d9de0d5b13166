"""Secret redaction (issue 4's shared stage): patterns are data with examples run as tests."""

from __future__ import annotations

import glob
import os

import pytest
from conftest import CORPUS
from hypothesis import given
from hypothesis import strategies as st

from ckptwatch.sinks.redact import RedactionError, Redactor

REDACTOR = Redactor.load()


def test_every_packaged_example_holds():
    assert [p.id for p in REDACTOR.patterns] == [
        "private_key_block", "url_password", "userinfo_password", "webhook_url", "webhook_path", "query_signature",
        "signed_url_param",
        "azure_sas_sig", "bearer_token", "authorization_header", "aws_access_key_id", "github_token",
        "vendor_token", "gitlab_token", "jwt", "google_token", "cookie_header", "cli_flag_secret", "key_value_secret",
        "secret_key_spaced"]
    assert REDACTOR.check() == []


def test_no_corpus_line_is_touched():
    """Real training logs hold no secrets: redaction must not rewrite any of their lines."""
    lines = [line for f in glob.glob(str(CORPUS / "*" / "logs" / "**" / "*"), recursive=True)
             if os.path.isfile(f) for line in open(f, errors="replace")]
    assert len(lines) > 7000
    assert [x for x in lines if REDACTOR.redact(x) != x] == []


token = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/+", min_size=8, max_size=40)


@given(secret=token, key=st.sampled_from(["password", "PASSWORD", "api_key", "token", "secret", "hf_token"]),
       before=st.text(alphabet="abc :()", max_size=20))
def test_key_value_secrets_never_survive(secret, key, before):
    line = f"{before}{key}={secret} next"
    out = REDACTOR.redact(line)
    assert secret not in out
    assert out.endswith(" next")
    assert REDACTOR.redact(out) == out  # idempotent


@given(user=st.from_regex(r"[a-z]{1,8}", fullmatch=True), secret=token)
def test_url_passwords_never_survive(user, secret):
    out = REDACTOR.redact(f"s3 endpoint https://{user}:{secret}@store.internal/ckpt failed")
    assert secret not in out and f"https://{user}:[REDACTED]@store.internal/ckpt" in out


def test_user_file_adds_patterns_and_errors_name_file_and_id(tmp_path):
    extra = tmp_path / "mine.yaml"
    extra.write_text("patterns:\n  - id: wandb\n    pattern: 'WANDB_KEY_[0-9a-f]+'\n    replacement: '[W]'\n"
                     "    examples:\n      - line: 'k WANDB_KEY_abc1 x'\n        redacted: 'k [W] x'\n")
    r = Redactor.load([str(extra)])
    assert r.redact("k WANDB_KEY_abc1 x") == "k [W] x" and r.check() == []
    broken = tmp_path / "broken.yaml"
    broken.write_text("patterns:\n  - id: oops\n    pattern: '(unclosed'\n")
    with pytest.raises(RedactionError, match=r"broken.yaml: pattern oops: bad regex"):
        Redactor.load([str(broken)])
    with pytest.raises(RedactionError, match=r"nope.yaml: cannot read"):
        Redactor.load([str(tmp_path / "nope.yaml")])


def test_a_pattern_that_eats_ordinary_lines_fails_its_check(tmp_path):
    greedy = tmp_path / "greedy.yaml"
    greedy.write_text("patterns:\n  - id: greedy\n    pattern: 'token'\n    keep: ['tokenizer loaded']\n")
    bad = Redactor.load([str(greedy)]).check()
    assert any("greedy.yaml: pattern greedy: 'tokenizer loaded' must not change" in b for b in bad)
