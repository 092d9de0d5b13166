"""The generic layer under the packs, each mechanism on real pasted logs (tests/wild/dev,
their threads in each case's expected.json) and on the shapes they stand for: tracebacks
as notebooks, Colab and Rich print them, or with their indentation lost; a traceback header
behind other text; wrappers nobody registered; the frame vocabulary that places any
package's traceback in save, load or other code; and the generic layer alone, with every
framework pack turned off."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ckptwatch.ingest.prefix import learn_outer
from ckptwatch.ingest.tracebacks import normalize, split_headers
from ckptwatch.ingest.watcher import SourceWatcher
from ckptwatch.pipeline import PipelineOptions, diagnose

WILD = Path(__file__).resolve().parent / "wild" / "dev"
GENERIC_ONLY = PipelineOptions(rule_scopes=("system", "generic"))


def records(path: Path | str) -> list[str]:
    w = SourceWatcher([str(path)], archives=True)
    try:
        return w.poll(final=True)["line"].to_list()
    finally:
        w.close()


def found(path: Path | str, options: PipelineOptions | None = None) -> list[tuple]:
    incidents, _ = diagnose([str(path)], options)
    return [(i.kind, i.step, i.root_cause.cls if i.root_cause else None) for i in incidents]


def test_an_ipython_traceback_is_read_as_cpythons():
    """unsloth's save_pretrained_merged in a notebook: ultratb's header, ``File <path>:<n>, in
    <func>(...)`` frames and ``---->`` code lines; the OOM is the save's."""
    df = pl.DataFrame({"offset": [0, 1, 2, 3, 4], "line": [
        "OutOfMemoryError                          Traceback (most recent call last)",
        "Cell In[21], line 2",
        "----> 2 model.save_pretrained_merged(new_model_local, tokenizer, save_method=\"merged_16bit\")",
        "File /usr/local/lib/python3.10/dist-packages/unsloth/save.py:1298, in unsloth_save_pretrained_merged(self, "
        "save_directory)",
        "-> 1298 unsloth_save_model(**arguments)"]})
    assert normalize(df)["line"].to_list() == [
        "Traceback (most recent call last): (OutOfMemoryError)",
        '  File "<cell 21>", line 2, in <module>',
        "    2 model.save_pretrained_merged(new_model_local, tokenizer, save_method=\"merged_16bit\")",
        '  File "/usr/local/lib/python3.10/dist-packages/unsloth/save.py", line 1298, in unsloth_save_pretrained_merged',
        "    1298 unsloth_save_model(**arguments)"]
    assert found(WILD / "finetune-unsloth-2193" / "logs") == [("interrupted_save", None, "cuda_oom")]


def test_a_notebook_traceback_cut_before_its_exception_line_is_classed_by_its_header():
    """IPython names the exception above the frames: unsloth's merged save (the paste stops
    inside the traceback) raised OutOfMemoryError; GLAMOUR's early-stopping torch.save raised
    PermissionError on its .pth path, a storage failure. A CPython traceback cut the same way
    names nothing: the save code raised an exception (a traceback is printed for nothing
    else), which one the report says is cut off."""
    assert found(WILD / "finetune-unsloth-1667" / "logs") == [("interrupted_save", None, "cuda_oom")]
    assert found(WILD / "torch-glamour-3" / "logs") == [("storage_failure_during_save", None, "storage_error")]
    incidents, _ = diagnose([str(WILD / "torch-glamour-3" / "logs")])
    assert "header names PermissionError" in incidents[0].root_cause.note
    assert found(WILD / "megatron-speech-12203" / "logs")[0][2] == "exception"
    incidents, _ = diagnose([str(WILD / "megatron-speech-12203" / "logs")])
    assert "cut off before its exception line: which one is not in the paste" in incidents[0].root_cause.note


def test_a_colab_traceback_with_hidden_frames_is_read_as_cpythons():
    lines = records(WILD / "finetune-unsloth-2193" / "logs")
    tb = next(x for x in lines if "_merge_lora" in x)
    assert '  File "/usr/local/lib/python3.11/dist-packages/unsloth/save.py", line 0, in _merge_lora' in tb
    assert "    [3 frames hidden]" in tb and tb.endswith("GPU 0 has a total capacity of 14.74 GiB of w")


def test_a_rich_traceback_box_is_read_as_cpythons():
    df = pl.DataFrame({"offset": list(range(6)), "line": [
        "╭─────────────── Traceback (most recent call last) ───────────────╮",
        "│ /root/sd-scripts/venv/lib/python3.10/site-packages/accelerate/commands/accelerate_cli.py: │",
        "│ 45 in main                                                       │",
        "│ /root/sd-scripts/library/model_util.py:1103 in save_stable_diffusion_checkpoint │",
        "╰──────────────────────────────────────────────────────────────────╯",
        "RuntimeError: boom"]})
    out = [x for x in normalize(df)["line"].to_list() if x]
    assert out == ["Traceback (most recent call last):",
                   '  File "/root/sd-scripts/venv/lib/python3.10/site-packages/accelerate/commands/accelerate_cli.py", '
                   "line 45, in main",
                   '  File "/root/sd-scripts/library/model_util.py", line 1103, in save_stable_diffusion_checkpoint',
                   "RuntimeError: boom"]


PYTEST_LONG = """\
=================================== FAILURES ===================================
____________________________ test_checkpoint_roundtrip ____________________________

tmp_path = PosixPath('/tmp/pytest-of-ci/pytest-3/test_checkpoint_roundtrip0')

    def test_checkpoint_roundtrip(tmp_path):
        trainer = make_trainer(tmp_path)
>       trainer.save_checkpoint(tmp_path / "ckpt")

tests/test_trainer.py:88: 
_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ 
src/trainer.py:140: in save_checkpoint
    torch.save(self.state_dict(), path / "model.pt")
_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ 

obj = {'model': <object>, 'lr_fn': <function <lambda> at 0x7f>}

    def _save(obj, zip_file, pickle_module, pickle_protocol, _disable_byteorder_record):
        pickler = pickle_module.Pickler(data_buf, protocol=pickle_protocol)
>       pickler.dump(obj)
E       AttributeError: Can't pickle local object 'make_trainer.<locals>.<lambda>'
E       (while pickling the state dict)

/venv/lib/python3.11/site-packages/torch/serialization.py:841: AttributeError
=========================== short test summary info ============================
FAILED tests/test_trainer.py::test_checkpoint_roundtrip - AttributeError: Can't pickle local object
"""


def test_a_pytest_failure_is_read_as_a_cpython_traceback(tmp_path):
    """pytest's --tb=long / --tb=short entries (_pytest/_code/code.py ReprEntry): the short
    frames and the long entries' locations become frames (a long entry named by its def), the
    E lines the exception; a failure through torch.save is a failed save."""
    (tmp_path / "ci.log").write_text(PYTEST_LONG)
    tb = next(x for x in records(tmp_path) if x.startswith("Traceback"))
    assert '  File "tests/test_trainer.py", line 88, in test_checkpoint_roundtrip' in tb
    assert '  File "src/trainer.py", line 140, in save_checkpoint\n    torch.save(' in tb
    assert tb.endswith("AttributeError: Can't pickle local object 'make_trainer.<locals>.<lambda>'\n"
                       "    (while pickling the state dict)\n"
                       '  File "/venv/lib/python3.11/site-packages/torch/serialization.py", line 841, in _save')
    incidents, _ = diagnose([str(tmp_path)])
    assert [(i.kind, i.root_cause.cls) for i in incidents] == [("interrupted_save", "exception")]
    assert incidents[0].root_cause.note == "the save code raised AttributeError"
    # without an E line or a short frame, a file's location-like lines and assignments stay
    df = pl.DataFrame({"offset": [0, 1, 2], "line": ["src/trainer.py:12: ", "lr = 0.1", "_ _ _ _ _ _"]})
    assert normalize(df)["line"].to_list() == ["src/trainer.py:12: ", "lr = 0.1", "_ _ _ _ _ _"]


def test_a_traceback_header_behind_a_save_line_starts_its_own_record():
    """CN-DPM printed 'Saving checkpoint... ' without a newline; pickle.dump then raised."""
    df = pl.DataFrame({"offset": [100], "line": ["Saving checkpoint... Traceback (most recent call last):"]})
    out = split_headers(df)
    assert out.rows() == [(100, "Saving checkpoint..."), (121, "Traceback (most recent call last):")]
    assert found(WILD / "torch-cn-dpm-5" / "logs") == [("interrupted_save", None, "exception")]


def test_a_traceback_that_lost_its_indentation_is_one_record():
    """A paste outside a markdown code block: every frame at column 0 (diffusers' LoRA save
    refusing an empty file name)."""
    tb = [x for x in records(WILD / "diffusion-fast-stable-diffusion-2370" / "logs") if x.startswith("Traceback")]
    assert len(tb) == 1 and tb[0].count("\nFile ") == 6
    assert found(WILD / "diffusion-fast-stable-diffusion-2370" / "logs") == [("interrupted_save", None, "exception")]


def test_wrappers_nobody_registered_are_learned_from_the_files_tracebacks(tmp_path):
    body = ["Saving checkpoint to ./output/checkpoint-450",
            "Traceback (most recent call last):",
            '  File "/venv/lib/python3.11/site-packages/torch/serialization.py", line 650, in _save',
            "    zip_file.write_record(name, storage.data_ptr(), num_bytes)",
            "RuntimeError: [enforce fail at inline_container.cc:337] . unexpected pos 2309312 vs 2309200"]
    for wrapper, want in (("9-task-1-0/0 [default0]:", r"^\d+-task-\d+-\d+/\d+[ \t]?"),
                          ("gpu-node-17 out: ", r"^gpu-node-\d+ out:[ \t]?"),
                          ("2024-03-01T10:00:00.123Z stdout F ", r"^\d+-\d+-\d+T\d+:\d+:\d+\.\d+Z stdout F[ \t]?")):
        lines = [wrapper + x for x in body]
        assert learn_outer(lines) == (want,)
        (tmp_path / "console.log").write_text("\n".join(lines) + "\n")
        incidents, _ = diagnose([str(tmp_path / "console.log")])
        assert [(i.kind, i.step, i.root_cause.cls) for i in incidents] == [
            ("storage_failure_during_save", 450, "storage_error")]
    # a container runtime's time in the wrapper still dates the lines
    assert incidents[0].root_cause.ts.isoformat() == "2024-03-01T10:00:00.123000+00:00"


def test_registered_labels_are_never_taken_for_an_unknown_wrapper():
    """srun's task label, the excepthook's rank, a JSON line and pdsh's host are read by
    split_prefixes itself, which keeps their rank or host."""
    for prefix in ("0: [rank0]:", "[rank1]: ", "[default3]:", '{"log":"'):
        lines = [prefix + "Traceback (most recent call last):"] + [prefix + '  File "x.py", line 1, in f'] * 4
        assert learn_outer(lines) == (), prefix


def test_a_paste_that_starts_inside_a_label_is_read():
    lines = ["rank0]: Traceback (most recent call last):", '[rank0]:   File "x.py", line 1, in f',
             "[rank0]: ValueError: x"]
    assert learn_outer(lines) == (r"^[A-Za-z_]{0,12}\d{1,6}\]: ?",)


def test_the_frame_vocabulary_places_tracebacks_in_save_load_or_other_code():
    # evaluation (HF's _maybe_log_save_evaluate dispatching to evaluate -> get_eval_dataloader): no load failure
    assert found(WILD / "hf-stanford-alpaca-42" / "logs") == []
    # stable-baselines3's BaseAlgorithm.load -> an AssertionError deep in its setup: a failed load
    assert found(WILD / "rl-huggingface-sb3-21" / "logs") == [("load_failure", None, "load_error")]
    # a traceback through NeMo's ModelCheckpoint._save_last_checkpoint, cut before its exception line
    assert found(WILD / "megatron-speech-12203" / "logs") == [("interrupted_save", None, "exception")]


def test_the_generic_layer_alone_reads_stacks_no_pack_covers():
    """Every framework pack off: Lua Torch's short write in torch.save, Keras' h5py refusing
    to create the .h5 of model.save, and a traceback through keras saving.py."""
    assert found(WILD / "other-torch7-256" / "logs", GENERIC_ONLY) == [
        ("storage_failure_during_save", None, "storage_error")]
    assert found(WILD / "tf-bosssensor-21" / "logs", GENERIC_ONLY) == [
        ("storage_failure_during_save", None, "storage_error")]
    assert found(WILD / "tf-importance-sampling-24" / "logs", GENERIC_ONLY) == [
        ("interrupted_save", None, "exception")]


def test_a_crash_is_the_cause_and_the_writers_complaint_after_it_collateral(tmp_path):
    """Lines that inherit one time are ordered by the file: a segfault, then the zip writer's
    short write, is a torn save by a native crash, not a storage failure."""
    log = tmp_path / "console.log"
    log.write_text("Saving checkpoint to /ckpt/step_100\nFatal Python error: Segmentation fault\n"
                   "RuntimeError: [enforce fail at inline_container.cc:445] . PytorchStreamWriter failed writing "
                   "file data/176: file write failed\n")
    assert found(log) == [("interrupted_save", 100, "native_crash")]
    log.write_text("Saving checkpoint to /ckpt/step_100\n"
                   "RuntimeError: [enforce fail at inline_container.cc:445] . PytorchStreamWriter failed writing "
                   "file data/176: file write failed\nFatal Python error: Segmentation fault\n")
    assert found(log) == [("storage_failure_during_save", 100, "storage_error")]


def test_a_quoted_paste_and_a_wrapper_that_names_the_rank_are_read(tmp_path):
    body = ["Saving checkpoint to out/step_40", "Traceback (most recent call last):",
            '  File "/venv/lib/python3.11/site-packages/torch/serialization.py", line 650, in _save',
            "    zip_file.write_record(name, storage.data_ptr(), num_bytes)",
            "RuntimeError: [enforce fail at inline_container.cc:337] . unexpected pos 2309312 vs 2309200"]
    (tmp_path / "quoted.log").write_text("".join(f"> {x}\n" for x in body))
    assert found(tmp_path / "quoted.log") == [("storage_failure_during_save", 40, "storage_error")]
    (tmp_path / "worker.log").write_text("".join(f"worker-rank-3 | {x}\n" for x in body))
    incidents, _ = diagnose([str(tmp_path / "worker.log")])
    assert [(i.kind, i.root_cause.rank) for i in incidents] == [("storage_failure_during_save", 3)]


def test_deaths_by_signal_in_ide_container_and_shell_words(tmp_path):
    for line, cls in (("Process finished with exit code 137 (interrupted by signal 9: SIGKILL)", "signal"),
                      ("Killed: 9", "signal"), ("Segmentation fault (core dumped)", "native_crash"),
                      ("trainer_1 exited with code 139", "native_crash")):
        (tmp_path / "a.log").write_text(f"Step 1200: lr=3e-4\nSaving checkpoint...\n{line}\n")
        assert found(tmp_path / "a.log") == [("interrupted_save", 1200, cls)], line


def test_incidents_with_no_job_step_or_path_of_two_pastes_get_two_ids(tmp_path):
    """With nothing else to tell them apart (no job, step or path), the file they were read
    from keeps two pastes' incidents from sharing one id in a database."""
    ids = []
    for name in ("a.log", "b.log"):
        (tmp_path / name).write_text("OSError: Unable to open file (truncated file: eof = 9437184, sblock->base_addr = 0, "
                                     "stored_eof = 10956472)\n")
        incidents, _ = diagnose([str(tmp_path / name)])
        assert [(i.kind, i.step, i.checkpoint_path) for i in incidents] == [("load_failure", None, None)]
        ids.append(incidents[0].id)
    assert ids[0] != ids[1]
    again, _ = diagnose([str(tmp_path / "a.log")])
    assert again[0].id == ids[0]  # the same input gives the same id


def test_a_record_glued_behind_a_progress_bar_gets_its_own_line():
    """tqdm redraws with a carriage return, which a paste loses: torchrun's glog line then
    starts right after the bar's ``]``. Split there, the bar keeps its step and the line its
    level, time and pid."""
    from ckptwatch.ingest.glued import split_glued
    bar = "  5%|▍         | 200/4443 [11:11:27<255:23:04, 216.68s/it]"
    rec = "W0613 07:54:19.850000 180275 site-packages/torch/distributed/elastic/multiprocessing/api.py:897] Sending"
    df = pl.DataFrame({"offset": [10], "line": [bar + rec]})
    assert split_glued(df).rows() == [(10, bar), (10 + len((bar).encode()), rec)]
    untouched = pl.DataFrame({"offset": [0], "line": ["Epoch 1: 100%|██| 163/163 [18:20<00:00, 6.75s/it, loss=0.98]"]})
    assert split_glued(untouched).equals(untouched)


def test_a_death_at_a_save_point_of_a_job_that_logs_no_save_line_is_a_presumed_save():
    """HF Trainer logs its save at INFO, hidden by default: trl's GRPO run killed (-9) with
    the bar on step 200 (a save_steps multiple), Lightning killed when an epoch's bar
    completed, ms-swift SIGTERMed after its last train and eval bars. The incident's save
    line is the progress line, marked presumed."""
    assert found(WILD / "hf-open-r1-675" / "logs") == [("interrupted_save", 200, "signal")]
    assert found(WILD / "lightning-colossalai-2398" / "logs") == [("interrupted_save", 325, "signal")]
    assert found(WILD / "finetune-ms-swift-8193" / "logs") == [("interrupted_save", 7, "signal")]
    incidents, _ = diagnose([str(WILD / "hf-open-r1-675" / "logs")])
    save_lines = [e for e in incidents[0].evidence if e.role == "save"]
    assert [e.line.strip()[:23] for e in save_lines] == ["5%|▍         | 200/4443"]
    assert incidents[0].root_cause.rank == 3


def test_a_death_elsewhere_or_a_scheduler_stop_presumes_no_save(tmp_path):
    bar = "Train:  12%|█▏        | {n}/300 [01:02<05:10,  1.20s/it]"
    for n, last, want in ((37, "Killed", []), (150, "Killed", [("interrupted_save", 150, "signal")]),
                          (150, "slurmstepd: error: *** JOB 77 ON node1 CANCELLED AT 2024-01-01T00:00:00 DUE TO "
                                "TIME LIMIT ***", [])):
        log = tmp_path / f"{n}-{len(last)}.log"
        log.write_text("\n".join([bar.format(n=i) for i in range(n - 2, n + 1)] + [last]) + "\n")
        assert found(log) == want, (n, last)
    # a job that logs its saves would have logged this one
    log = tmp_path / "logged.log"
    log.write_text("\n".join(["Saving model checkpoint to out/checkpoint-100", bar.format(n=100),
                              bar.format(n=150), "Killed"]) + "\n")
    assert found(log) == []


def test_rays_worker_prefix_with_an_ipv6_address_and_a_pasted_indent_is_read():
    """verl's FSDP save_checkpoint raising inside a Ray actor, pasted indented."""
    lines = records(WILD / "rl-verl-4799" / "logs")
    assert lines[0].startswith('  File "/opt/tiger/open_verl/verl/single_controller/base/decorator.py", line 456, in inner\n')
    assert "WorkerDict" not in "".join(lines)
    assert found(WILD / "rl-verl-4799" / "logs") == [("interrupted_save", None, "exception")]


def test_the_save_codes_own_rename_race_is_an_exception_not_a_storage_failure():
    """transformers' _save_checkpoint renaming tmp-checkpoint-* onto checkpoint-100 from
    several ranks: ENOTEMPTY, in a traceback or pasted as its one line."""
    assert found(WILD / "finetune-ms-swift-3031" / "logs") == [("interrupted_save", 100, "exception")]
    assert found(WILD / "hf-trl-2928" / "logs") == [("interrupted_save", 100, "exception")]


def test_a_failure_logged_without_its_traceback_fails_the_open_save():
    """Keras' h5py 'Unable to create file' for the file ModelCheckpoint was saving; OLMo's
    excepthook logging 'Uncaught AssertionError' after 'Saving final checkpoint...'."""
    assert found(WILD / "tf-automatic-modulation-rec-1" / "logs") == [
        ("storage_failure_during_save", None, "storage_error")]
    assert found(WILD / "torch-olmo-664" / "logs") == [("interrupted_save", None, "exception")]


def test_restores_that_fail_for_the_checkpoint_are_load_failures_of_its_step():
    """Orbax restoring on other devices than the save's (a world-size mismatch without sizes);
    TF 1.x 'Tensor name … not found in checkpoint files Resnet_iter_200000.ckpt'; TF's
    Saver.restore handed a shard file (its step from the name in the message); DCP's missing
    key; Paddle v2's parameters.to_tar raising inside its serializer is a failed save."""
    assert found(WILD / "jax-demonstration-informatio-1" / "logs") == [("world_size_mismatch", None, "load_error")]
    assert found(WILD / "tf-tffrcnn-50" / "logs") == [("load_failure", 200000, "load_error")]
    assert found(WILD / "tf-magenta-1540" / "logs") == [("load_failure", 60, "load_error")]
    assert found(WILD / "torch-torchtitan-2622" / "logs") == [("load_failure", None, "load_error")]
    assert found(WILD / "paddle-paddle-2895" / "logs") == [("interrupted_save", None, "exception")]
    # 'Failed to download saved model' ends no save, and export_saved_model is no save code
    assert found(WILD / "tf-sagemaker-tensorflow-tra-115" / "logs") == []


def test_a_pasted_journal_beside_a_console_dates_and_explains_a_bare_killed(tmp_path):
    """journalctl -k has no year: it takes the console's (2024), not the file's mtime, and its
    OOM kill, seconds after bash's 'Killed' of a job that names no host or pid, is the cause."""
    (tmp_path / "console.log").write_text(
        "[INFO|trainer.py:3410] 2024-12-07 10:00:00,101 >> Saving model checkpoint to out/checkpoint-500\nKilled\n")
    (tmp_path / "journal.log").write_text(
        "Dec 07 10:00:05 gpu-node-3 kernel: Out of memory: Killed process 48213 (python) total-vm:912345678kB, "
        "anon-rss:250123456kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:500000kB oom_score_adj:0\n")
    incidents, _ = diagnose([str(tmp_path)])
    assert [(i.kind, i.step, i.root_cause.cls) for i in incidents] == [("interrupted_save", 500, "oom_kill")]
    assert incidents[0].root_cause.ts.year == 2024
    # an OOM kill a minute and more away explains nothing
    (tmp_path / "journal.log").write_text(
        "Dec 07 10:03:05 gpu-node-3 kernel: Out of memory: Killed process 48213 (python) total-vm:912345678kB, "
        "anon-rss:250123456kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:500000kB oom_score_adj:0\n")
    assert found(tmp_path) == [("interrupted_save", 500, "signal")]
