"""The rule engine and the rule packs: examples run as tests, broken files are named."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import polars as pl
import pytest

from ckptwatch.rules import RuleError, RuleSet, check_rule_files
from ckptwatch.rules.engine import _example_records, load_rule_file

PACKAGED = RuleSet.load()


def test_packaged_rule_examples_all_pass():
    n, errors = check_rule_files([])
    assert errors == []
    assert n == len(PACKAGED.rules) and n >= 40


@pytest.mark.parametrize("family", ["torchrun", "gloo", "nccl", "kernel", "storage", "deepspeed", "load_errors"])
def test_every_required_family_has_a_pack(family):
    import yaml

    from ckptwatch.rules.engine import packaged_rule_files

    families = {yaml.safe_load(open(f))["family"] for f in packaged_rule_files()}
    assert family in families


def _write(tmp_path, body: str):
    p = tmp_path / "mine.yaml"
    p.write_text(textwrap.dedent(body))
    return str(p)


def test_broken_regex_is_reported_with_file_rule_and_reason(tmp_path):
    path = _write(tmp_path, """
        family: mine
        rules:
          - id: mine.bad
            event: save_start
            prefilter: "x"
            pattern: '(?<=x)y'
            examples: {match: ["xy"]}
    """)
    n, errors = check_rule_files([path])
    assert [(e.file, e.rule_id) for e in errors] == [(path, "mine.bad")]
    assert "does not compile" in errors[0].reason and "look-around" in errors[0].reason


def test_example_that_does_not_match_and_unknown_kind(tmp_path):
    path = _write(tmp_path, """
        family: mine
        rules:
          - id: mine.nomatch
            event: save_start
            prefilter: "saving"
            pattern: 'saving step (?P<step>\\d+)'
            examples: {match: [{line: "saving step 7", expect: {step: 8}}], no_match: ["saving step 9"]}
          - id: mine.kind
            event: not_a_kind
            prefilter: "a"
            pattern: 'a'
            examples: {match: ["a"]}
    """)
    with pytest.raises(RuleError) as e:
        load_rule_file(path)
    assert "mine.kind" in str(e.value) and "not a known kind" in str(e.value)


def test_expect_mismatch_and_no_match_reported(tmp_path):
    path = _write(tmp_path, """
        family: mine
        rules:
          - id: mine.save
            event: save_start
            prefilter: "zz saving"
            pattern: 'zz saving step (?P<step>\\d+)'
            examples: {match: [{line: "zz saving step 7", expect: {step: 8}}], no_match: ["zz saving step 9"]}
    """)
    _, errors = check_rule_files([path])
    reasons = sorted(e.reason for e in errors if e.rule_id == "mine.save")
    assert len(reasons) == 2
    assert "expected step=8, got 7" in reasons[0]
    assert "no_match example matched" in reasons[1]


def test_invalid_yaml_names_the_line(tmp_path):
    path = _write(tmp_path, "family: x\nrules:\n  - id: a\n    event: [unclosed\n")
    _, errors = check_rule_files([path])
    assert len(errors) == 1 and errors[0].file == path and "invalid YAML: line" in errors[0].reason


def test_cli_rules_check_exit_codes(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "ckptwatch", "rules", "check"], capture_output=True, text=True)
    assert ok.returncode == 0 and "rules OK" in ok.stdout
    path = _write(tmp_path, "family: x\nrules:\n  - id: x.a\n    event: save_start\n")
    bad = subprocess.run([sys.executable, "-m", "ckptwatch", "rules", "check", path], capture_output=True, text=True)
    assert bad.returncode == 1
    assert f"{path}: rule x.a: missing or empty 'pattern'" in bad.stderr.replace("\n", "")
    assert "Traceback" not in bad.stderr


def test_first_matching_rule_wins_and_groups_fill_columns():
    lines = [
        "E1130 10:21:21.702000 5872 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) "
        "local_rank: 2 (pid: 5879) of binary: /usr/bin/python3",
        "[2026-11-30 10:21:21.111] [INFO] [rank2] saving checkpoint at iteration      40 to /ckpt in torch_dist format",
        "nothing to see",
    ]
    ev = PACKAGED.apply(_example_records(lines, "console"))
    assert ev["offset"].to_list() == [0, 1]
    assert ev["kind"].to_list() == ["process_exit", "save_start"]
    assert ev["pid"].to_list() == [5879, None] and ev["local_rank"].to_list() == [2, None]
    assert ev["step"].to_list() == [None, 40] and ev["path"].to_list() == [None, "/ckpt/iter_0000040"]
    assert json.loads(ev["attrs"][0]) == {"exitcode": -9, "reporter": "agent"}


def test_prefilter_is_applied_before_the_regex():
    # a record that matches a pattern but lacks the literal prefilter is never claimed
    recs = _example_records(["Timed out waiting 20000ms for recv operation"], "log")
    assert PACKAGED.apply(recs).is_empty()


def test_batch_of_many_lines_is_matched_column_wise():
    base = "2026-11-30 10:22:53,473 INFO [rank1/4] train: saving checkpoint step {} to /c/step_{}"
    lines = [base.format(i, i) if i % 10 == 0 else f"2026-11-30 10:22:53,473 INFO noise {i}" for i in range(5000)]
    ev = PACKAGED.apply(_example_records(lines, "log"))
    assert ev.height == 500
    assert ev.filter(pl.col("step") == 4990)["path"].to_list() == ["/c/step_4990"]


def test_a_users_pack_replaces_or_disables_a_packaged_rule_by_id(tmp_path):
    """The fix for a misfiring packaged rule is a pack of one's own: same id replaces the
    packaged rule where it stands; disable: true removes it; an unknown id is refused."""
    line = "2026-11-30 10:00:00,000 INFO [rank1/4] train: saving checkpoint step 40 to /ckpt/step_40"
    records = _example_records([line], "log")
    assert PACKAGED.apply(records)["rule_id"].to_list() == ["plain.saving_checkpoint"]
    pack = tmp_path / "mine.yaml"
    pack.write_text("""
family: mine
rules:
  - id: plain.saving_checkpoint
    event: save_start
    prefilter: "saving checkpoint step"
    pattern: 'saving checkpoint step (?P<step>\\d+) to (?P<path>\\S+)'
    attrs: {mine: 1}
    examples:
      match: ["saving checkpoint step 40 to /ckpt/step_40"]
""")
    mine = RuleSet.load([str(pack)])
    ev = mine.apply(records).row(0, named=True)
    assert (ev["rule_id"], ev["attrs"]) == ("plain.saving_checkpoint", '{"mine": 1}')
    assert [r.id for r in mine.rules] == [r.id for r in PACKAGED.rules]  # replaced in place
    assert check_rule_files([str(pack)]) == (len(PACKAGED.rules), [])

    pack.write_text("family: mine\nrules:\n  - {id: plain.saving_checkpoint, disable: true}\n")
    off = RuleSet.load([str(pack)])
    assert off.apply(records).is_empty() and len(off.rules) == len(PACKAGED.rules) - 1

    pack.write_text("family: mine\nrules:\n  - {id: plain.saving_checkpointt, disable: true}\n")
    with pytest.raises(RuleError, match="plain.saving_checkpointt: disables a rule no packaged pack has"):
        RuleSet.load([str(pack)])
    n, errors = check_rule_files([str(pack)])
    assert [e.rule_id for e in errors] == ["plain.saving_checkpointt"]
