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


def test_every_packaged_rule_cites_the_source_it_was_written_from():
    assert [r.id for r in PACKAGED.rules if len(r.source) < 20] == []


@pytest.mark.parametrize("family", ["torchrun", "gloo", "nccl", "kernel", "storage", "deepspeed", "load_errors",
                                    "huggingface", "lightning", "megatron", "torchtitan", "torchtune", "nemo",
                                    "composer", "ray", "diffusers", "slurm", "kubernetes", "launchers", "plain"])
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


def _records(lines):
    return _example_records(lines, "log")


def test_a_traceback_through_save_code_is_tagged_during_save_and_a_load_rule_with_during_skips_it():
    save_tb = ("Traceback (most recent call last):\n  File \"/venv/lib/python3.11/site-packages/torch/serialization.py\", "
               "line 944, in save\n    _save(\nOSError: [Errno 28] No space left on device")
    load_tb = ("Traceback (most recent call last):\n  File \"/venv/lib/python3.11/site-packages/transformers/trainer_callback.py\","
               " line 152, in load_from_json\n    with open(p) as f:\n"
               "FileNotFoundError: [Errno 2] No such file or directory: 'out/checkpoint-20/trainer_state.json'")
    plain_tb = ("Traceback (most recent call last):\n  File \"train.py\", line 3, in main\n    open(p)\n"
                "FileNotFoundError: [Errno 2] No such file or directory: 'data/train.jsonl'")
    ev = PACKAGED.apply(_records([save_tb, load_tb, plain_tb]))
    got = {r["offset"]: (r["kind"], json.loads(r["attrs"]).get("during"), r["step"]) for r in ev.iter_rows(named=True)}
    assert got[0] == ("storage_error", "save", None)
    assert got[1] == ("load_error", "load", 20)  # the step from the checkpoint's name
    assert 2 not in got  # a missing data file outside load code is not a load failure


def test_alternative_groups_fill_one_column(tmp_path):
    pack = _write(tmp_path, """
        rules:
          - id: mine.missing
            event: load_error
            prefilter: "missing: "
            pattern: 'missing: (?:''(?P<path>[^'']+)''|(?P<path__2>\\S+))'
            examples:
              match:
                - line: "missing: '/ckpt/step_40/a.pt'"
                  expect: {path: /ckpt/step_40/a.pt, step: 40}
                - line: "missing: /ckpt/step_50/a.pt"
                  expect: {path: /ckpt/step_50/a.pt, step: 50}
        """)
    assert check_rule_files([pack]) == (len(PACKAGED.rules) + 1, [])
    ev = RuleSet.load([pack]).apply(_records(["missing: /ckpt/step_50/a.pt"]))
    assert ev.row(0, named=True)["path"] == "/ckpt/step_50/a.pt" and "path__2" not in ev["attrs"][0]


def test_a_number_in_a_checkpoint_root_is_not_a_step():
    ev = PACKAGED.apply(_records(["2026-11-30 10:00:00,000 INFO train: Saving checkpoint to /ckpt/run-17/latest",
                                  "2026-11-30 10:00:00,000 INFO train: Saving checkpoint to /models/gpt-7b/ckpt_step_30.pt"]))
    assert ev["step"].to_list() == [None, 30]


def test_a_rule_with_a_bad_during_or_source_is_named(tmp_path):
    pack = _write(tmp_path, """
        rules:
          - id: mine.bad
            event: load_error
            during: sometimes
            prefilter: "x"
            pattern: "x"
            examples: {match: ["x"]}
        """)
    with pytest.raises(RuleError, match="mine.bad.*'during' must be save or load"):
        load_rule_file(pack)
