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
    # the packaged rule is gone; the generic layer under every pack still reads a save line
    assert off.apply(records)["rule_id"].to_list() == ["generic.saving"] and len(off.rules) == len(PACKAGED.rules) - 1

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


# -- issue 14: a rule pack is validated fully at load; nothing in it can crash a match later

def _rule(tmp_path, extra: str, *, pattern: str = r"saving step (?P<step>\d+) to (?P<path>\S+)",
          example: str = "saving step 5 to /ckpt") -> str:
    """A pack of one rule ``mine.r`` with ``extra`` (YAML lines at rule level) added."""
    body = "family: mine\nrules:\n  - id: mine.r\n    event: save_start\n    prefilter: saving\n" \
           f"    pattern: '{pattern}'\n    examples: {{match: [{json.dumps(example)}]}}\n"
    body += "".join(f"    {line}\n" for line in extra.splitlines() if line)
    p = tmp_path / "mine.yaml"
    p.write_text(body)
    return str(p)


@pytest.mark.parametrize("extra, reason", [
    ("attrs: {since: 2024-01-01}", "'attrs' since: a date; attrs values are strings, numbers or booleans"),
    ("attrs: {2024-01-01: x}", "'attrs' key 2024-01-01: a date; attrs names are strings"),
    ("attrs: {1: x}", "'attrs' key 1: an int; attrs names are strings"),
    ("attrs: {n: .inf}", "'attrs' n: a float that is not finite"),
    ("attrs: {n: 123456789012345678901234567890}", "'attrs' n: an integer outside 64 bits"),
    ("attrs: {n: [1, 2]}", "'attrs' n: a list; attrs values are strings, numbers or booleans"),
    ("attrs: [a, b]", "'attrs' must be a mapping"),
])
def test_attrs_are_validated_at_load(tmp_path, extra, reason):
    path = _rule(tmp_path, extra)
    with pytest.raises(RuleError) as e:
        load_rule_file(path)
    assert (e.value.file, e.value.rule_id) == (path, "mine.r")
    assert reason in e.value.reason, e.value.reason


def test_a_date_attr_key_no_longer_crashes_the_first_match(tmp_path):
    # used to pass loading and raise TypeError from json.dumps at the first matching line
    path = _rule(tmp_path, "attrs: {2024-01-01: x, 1: y}")
    with pytest.raises(RuleError, match="mine.r"):
        RuleSet.load([path], packaged=False)


@pytest.mark.parametrize("fmt, reason", [
    ("{step:300000000d}", "width 300000000 is more than 64"),
    ("{path:>99999}", "width 99999 is more than 64"),
    ("{step:.100f}", "precision 100 is more than 64"),
    ("{path.__class__}", "'path.__class__': only {path} and {step}"),
    ("{step[0]}", "'step[0]': only {path} and {step}"),
    ("{0}", "'0': only {path} and {step}"),
    ("{}", "'': only {path} and {step}"),
    ("{other}/x", "'other': only {path} and {step}"),
    ("{step:{path}}", "a nested field in the format spec"),
    ("{path!r}", "no conversion (!r)"),
    ("{path:d}", "format spec 'd' does not apply to {path}"),
    ("{step:zz}", "format spec 'zz' is not valid"),
    ("{path", "not a valid format string"),
    ("x" * 2000, "longer than 512 characters"),
])
def test_path_format_is_validated_at_load(tmp_path, fmt, reason):
    path = _rule(tmp_path, f"path_format: {json.dumps(fmt)}")
    with pytest.raises(RuleError) as e:
        load_rule_file(path)
    assert e.value.rule_id == "mine.r" and "path_format" in e.value.reason
    assert reason in e.value.reason, e.value.reason


def test_path_format_not_a_string_is_refused(tmp_path):
    with pytest.raises(RuleError, match="mine.r: 'path_format' must be a string"):
        load_rule_file(_rule(tmp_path, "path_format: 5"))


def test_good_path_formats_still_load(tmp_path):
    for fmt in ("{path}/iter_{step:07d}", "{path}/global_step{step}", "{path}/{step:>8}", "{{x}}/{path}"):
        (r,) = load_rule_file(_rule(tmp_path, f"path_format: {json.dumps(fmt)}"))
        assert r.path_format == fmt


def test_cli_rules_check_refuses_a_huge_format_width_quickly(tmp_path):
    path = _rule(tmp_path, 'path_format: "{step:300000000d}"')
    out = subprocess.run([sys.executable, "-m", "ckptwatch", "rules", "check", path], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1
    assert f"{path}: rule mine.r: 'path_format'" in out.stderr.replace("\n", "")
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("pattern", [r"saving (a+)+", r"saving (.*)*", r"saving (\w+\s?)*", r"saving (?:x|y+)*z",
                                     r"saving (?:\d{2,})+"])
def test_patterns_that_backtrack_catastrophically_are_refused(tmp_path, pattern):
    with pytest.raises(RuleError) as e:
        load_rule_file(_rule(tmp_path, "", pattern=pattern))
    assert e.value.rule_id == "mine.r"
    assert "nested unbounded repetition" in e.value.reason, e.value.reason


@pytest.mark.parametrize("pattern", [r"saving (?:, \w+=[^,)\n]*)*?, end", r"saving (?:the\s+|a\s+)*step",
                                     r"saving (\w+,)*", r"saving (a{1,5})+", r"saving a+b+"])
def test_repetitions_that_are_delimited_are_accepted(tmp_path, pattern):
    (r,) = load_rule_file(_rule(tmp_path, "", pattern=pattern))
    assert r.pattern == pattern


@pytest.mark.parametrize("pattern, reason", [
    ("saving " + "x" * 3000, "pattern is longer than 2000 characters"),
    (r"saving x{5000}", "repetition count 5000 is more than 1000"),
    (r"saving (?:x{2,900}){1,900}", "repetitions nested"),
])
def test_pattern_size_is_bounded(tmp_path, pattern, reason):
    with pytest.raises(RuleError) as e:
        load_rule_file(_rule(tmp_path, "", pattern=pattern))
    assert reason in e.value.reason, e.value.reason


@pytest.mark.parametrize("extra, reason", [
    ("sources: [[console]]", "'sources' must be a list drawn from"),
    ("sources: [{a: 1}]", "'sources' must be a list drawn from"),
    ("description: [1, 2]", "'description' must be a string"),
])
def test_wrongly_typed_fields_are_named_not_crashed_on(tmp_path, extra, reason):
    with pytest.raises(RuleError) as e:
        load_rule_file(_rule(tmp_path, extra))
    assert e.value.rule_id == "mine.r" and reason in e.value.reason


@pytest.mark.parametrize("examples, reason", [
    ("{match: [{line: 'saving step 5 to /c', expect: 'step 5'}]}", "'expect' must be a mapping"),
    ("{match: [{line: 'saving step 5 to /c', expect: {step: [5]}}]}", "'expect' step: a list"),
    ("{match: [{line: 'saving step 5 to /c', expect: {ts: 2026-11-30 10:00:00}}]}", "'expect' ts: a datetime"),
    ("{match: 'saving step 5 to /c'}", "'match' must be a list"),
    ("{match: ['saving step 5 to /c'], no_match: 'saving'}", "'no_match' must be a list"),
])
def test_examples_are_validated_at_load(tmp_path, examples, reason):
    p = tmp_path / "mine.yaml"
    p.write_text("rules:\n  - id: mine.r\n    event: save_start\n    prefilter: saving\n"
                 r"    pattern: 'saving step (?P<step>\d+) to (?P<path>\S+)'" + f"\n    examples: {examples}\n")
    with pytest.raises(RuleError) as e:
        load_rule_file(str(p))
    assert e.value.rule_id == "mine.r" and reason in e.value.reason, e.value.reason


def test_non_utf8_rule_file_is_named_with_its_line(tmp_path):
    p = tmp_path / "latin1.yaml"
    p.write_bytes(b"family: mine\n# caf\xe9\nrules: []\n")
    with pytest.raises(RuleError) as e:
        load_rule_file(str(p))
    assert str(e.value) == f"{p}: not UTF-8 text (line 2, byte 0xe9): save the file as UTF-8"


@pytest.mark.parametrize("depth", [5000, 100_000])
def test_deeply_nested_yaml_is_refused_not_a_crash(tmp_path, depth):
    # 100,000 levels used to crash libyaml's loader with a segmentation fault: run in a child
    p = tmp_path / "deep.yaml"
    p.write_text("rules: " + "[" * depth + "]" * depth + "\n")
    out = subprocess.run([sys.executable, "-m", "ckptwatch", "rules", "check", str(p)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 1, out.stderr[-2000:]
    assert f"{p}: nested too deeply" in out.stderr and "Traceback" not in out.stderr


def test_frames_are_validated_too(tmp_path):
    p = tmp_path / "frames.yaml"
    p.write_text("frames:\n  - {during: save, prefilter: x, pattern: '(x+)+', source: [1]}\n")
    with pytest.raises(RuleError) as e:
        load_rule_file(str(p))
    assert e.value.rule_id == "frame #1"


def test_an_impossible_yaml_date_is_named_not_a_traceback(tmp_path):
    # the YAML loader itself raises ValueError building 2024-02-30; it used to escape
    path = _rule(tmp_path, "attrs: {since: 2024-02-30}")
    with pytest.raises(RuleError) as e:
        load_rule_file(path)
    assert str(e.value) == f"{path}: not a usable rule pack: ValueError: day is out of range for month"


def test_a_path_that_already_names_the_iteration_is_not_extended():
    """Megatron-LM logs the checkpoint root ('... to /ckpt in torch_dist format'); a script that
    logs the iteration's directory itself must not get '/iter_0000300' twice."""
    from ckptwatch.rules.engine import _format_path
    fmt = "{path}/iter_{step:07d}"
    assert _format_path(fmt, "/ckpt", 300) == "/ckpt/iter_0000300"
    assert _format_path(fmt, "/ckpt/", 300) == "/ckpt/iter_0000300"
    assert _format_path(fmt, "/ckpt/iter_0000300", 300) == "/ckpt/iter_0000300"
    assert _format_path(fmt, "/ckpt/iter_0000200", 300) == "/ckpt/iter_0000200/iter_0000300"


def test_requires_and_a_list_prefilter_make_a_vocabulary_rule(tmp_path):
    """``requires``: every listed pattern must also match, anywhere and in any order; a list
    ``prefilter``: a record holding any one of its literals is tested."""
    pack = _write(tmp_path, """
        rules:
          - id: mine.load_vocab
            event: load_error
            prefilter: ["vanished", "absent"]
            pattern: '(?i)\\b(?:vanished|absent)\\b'
            requires: ['(?i)zshard', 'Error\\b']
            examples:
              match:
                - line: "ZshardError: /ckpt/step_40/zshard vanished"
                - line: "ZError: zshard absent"
              no_match:
                - "WARNING: zshard absent, going on"
                - "KeyError: vocab entry absent"
        """)
    assert check_rule_files([pack]) == (len(PACKAGED.rules) + 1, [])
    rules = RuleSet.load([pack], packaged=False)
    ev = rules.apply(_records(["ZshardError: /ckpt/step_40/zshard vanished", "ZError: zshard absent",
                               "WARNING: zshard absent, going on", "ZError: zshard loaded"]))
    assert ev["offset"].to_list() == [0, 1]
    assert ev["step"].to_list() == [40, None]  # the load line's path, found anywhere in it, names step 40


@pytest.mark.parametrize("requires, reason", [("checkpoint", "'requires' must be a list"),
                                              (["(unclosed"], "'requires' does not compile"),
                                              ([""], "'requires' must be a list")])
def test_a_bad_requires_is_named(tmp_path, requires, reason):
    pack = tmp_path / "bad.yaml"
    pack.write_text(json.dumps({"rules": [{"id": "mine.bad", "event": "load_error", "prefilter": "x", "pattern": "x",
                                           "requires": requires, "examples": {"match": [{"line": "x"}]}}]}))
    with pytest.raises(RuleError, match=reason):
        RuleSet.load([str(pack)])


def test_a_save_or_load_line_names_its_step_in_words_or_by_a_path_anywhere_in_it():
    ev = PACKAGED.apply(_records([
        "[2024-07-03 16:40:30,015] [ERROR] [ckpt_saver.py:1210:save_step_checkpoint] Rank 1 save checkpoint failed for step 2000",
        "[NeMo I 2024-05-26 02:15:08 nemo_model_checkpoint:573] Checkpoint save for step 2000 started at 1716689708.1234567.",
        "ValueError: The passed save_path is not a valid checkpoint: model.ckpt-1000.data-00000-of-00001",
        # HF's rotation names an older checkpoint: a save line's step is never taken from another path
        "[INFO|trainer.py:4076] 2024-06-01 10:02:09,500 >> Deleting older checkpoint [/out/checkpoint-100] due to args.save_total_limit",
    ]))
    assert list(zip(ev["kind"], ev["step"])) == [("save_error", 2000), ("save_start", 2000), ("load_error", 1000),
                                                 ("save_end", None)]
