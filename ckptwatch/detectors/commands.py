"""The commands of an incident: what to paste to verify, to resume from the last good
checkpoint, to convert a checkpoint for another world size, or to give a save more time.

:func:`commands` returns a list of ``{"purpose", "command", "framework", "source"}`` dicts
(``Incident.commands``), each naming the incident's real paths:

* ``verify``: ``ckptwatch verify <checkpoint>`` for the checkpoint the incident is about
  (and ``ckptwatch verify <last good>`` before resuming from that one);
* ``quarantine``: ``mv <checkpoint> <checkpoint>.partial`` for a checkpoint not every rank
  finished, so that "newest checkpoint" discovery cannot pick it up; in an object store, the
  store's own move (``aws s3 mv --recursive``, ``gsutil -m mv``, ``hdfs dfs -mv``), and none
  for a store whose tool is not known;
* ``resume``: the trainer's own way to resume from the last good checkpoint;
* ``reshard``: for a world-size change, the framework's conversion;
* ``timeout``: for a save cut off by a collective timeout, the process-group timeout
  setting of the trainer.

A path that is a URL (``s3://``, ``gs://``, ``hdfs://`` …) is never normalized as a local
path (that collapses ``//``), loses any ``user:password@`` it carries (a command is pasted
into channels and terminals: no credential goes into one), and gets no local-file commands
(``ckptwatch verify`` and tracker files read local folders).

The trainer is told by the rule packs that matched the incident's evidence (``hf.*``,
``megatron.*``, ...; :data:`FRAMEWORKS`, first match wins). ``source`` cites where the
flag or file is defined:

* HF Trainer: ``TrainingArguments.resume_from_checkpoint`` and ``ddp_timeout`` (seconds,
  default 1800), transformers ``src/transformers/training_args.py``;
* Megatron-LM: the tracker file ``latest_checkpointed_iteration.txt`` in the ``--save`` /
  ``--load`` folder (``get_checkpoint_tracker_filename``,
  ``megatron/training/checkpointing.py``), ``--ckpt-step`` and
  ``--distributed-timeout-minutes`` (``ckpt_step``, ``distributed_timeout_minutes`` of
  ``megatron/training/config``);
* DeepSpeed: the ``latest`` file naming the tag in the save folder
  (``DeepSpeedEngine.save_checkpoint`` / ``load_checkpoint``, ``deepspeed/runtime/engine.py``),
  ``deepspeed/checkpoint/ds_to_universal.py --input_folder --output_folder`` and
  ``"checkpoint": {"load_universal": true}`` (``deepspeed/runtime/constants.py``),
  ``deepspeed.init_distributed(timeout=...)`` (``deepspeed/comm/comm.py``);
* Lightning: ``Trainer.fit(..., ckpt_path=...)`` (``--ckpt_path`` with LightningCLI) and
  ``DDPStrategy(timeout=...)``;
* torchtitan: ``--checkpoint.load_step`` (``Checkpoint.load_step``,
  ``torchtitan/config/job_config.py``);
* PyTorch DCP: ``torch.distributed.checkpoint.load`` reshards on load;
  ``torch.distributed.init_process_group(timeout=...)``.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

from ckptwatch.detectors.incident import Incident

#: rule-pack prefixes of a trainer, in the order they are preferred (HF Trainer over the
#: DeepSpeed it drives; Megatron-LM over DeepSpeed under Megatron-DeepSpeed)
FRAMEWORKS = ("hf", "lightning", "megatron", "torchtitan", "deepspeed", "torchtune", "nemo", "composer", "dcp")
SAVE_KINDS = ("interrupted_save", "storage_failure_during_save", "partial_checkpoint")
_DS_TAG = re.compile(r"^global_step\d+$")
_HF_CHECKPOINT = re.compile(r"^checkpoint-\d+$")
_MEGATRON_ITER = re.compile(r"^iter_(\d+)$")


def framework(inc: Incident) -> str | None:
    """The trainer whose rules matched the incident's evidence (see :data:`FRAMEWORKS`), or
    None when only launcher, kernel or generic rules did."""
    found = {e.rule_id.split(".", 1)[0] for e in inc.evidence}
    return next((f for f in FRAMEWORKS if f in found), None)


_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?:[^/@\s]*@)?(?P<rest>.*)$")
#: how an object store's own tool moves a prefix (a "folder") aside
_STORE_MV = {"s3": "aws s3 mv --recursive {src} {dst}", "gs": "gsutil -m mv {src} {dst}",
             "gcs": "gsutil -m mv {src} {dst}", "hdfs": "hdfs dfs -mv {src} {dst}"}


def _url(path: str) -> tuple[str, str] | None:
    """``(scheme, url without user info)`` of a URL path (``s3://u:pw@b/k`` -> ``("s3",
    "s3://b/k")``), None for a local path."""
    m = _URL.match(path)
    if m is None:
        return None
    scheme = m.group("scheme").lower()
    return scheme, f"{scheme}://{m.group('rest')}"


def checkpoint_dir(path: str) -> str:
    """The folder a trainer's newest-checkpoint lookup sees: for DeepSpeed's tag folder
    inside an HF Trainer checkpoint (``out/checkpoint-500/global_step500``), the HF
    folder (``out/checkpoint-500``); else ``path`` itself."""
    p = os.path.normpath(path)
    parent = os.path.dirname(p)
    if _DS_TAG.match(os.path.basename(p)) and _HF_CHECKPOINT.match(os.path.basename(parent)):
        return parent
    return path


def _q(path: str) -> str:
    return shlex.quote(path)


def _cmd(purpose: str, command: str, fw: str | None, source: str) -> dict[str, Any]:
    return {"purpose": purpose, "command": command, "framework": fw or "any", "source": source}


def _resume(fw: str | None, path: str, step: Any, *, remote: bool = False) -> list[dict[str, Any]]:
    """How ``fw`` resumes from the checkpoint at ``path`` (step ``step``); ``remote``: a URL,
    which gets no tracker-file command (those write a local file)."""
    name = os.path.basename(os.path.normpath(path))
    root = os.path.dirname(os.path.normpath(path)) or "."
    if fw == "hf":
        return [_cmd("resume", f"--resume_from_checkpoint {_q(path)}", fw,
                     "transformers TrainingArguments.resume_from_checkpoint (or trainer.train(resume_from_checkpoint=...))")]
    if fw == "megatron":
        m = _MEGATRON_ITER.match(name)
        iteration = int(m.group(1)) if m else step
        if iteration is None:
            return []
        tracker = [] if remote else [
            _cmd("resume", f"echo {iteration} > {_q(os.path.join(root, 'latest_checkpointed_iteration.txt'))}", fw,
                 "Megatron-LM checkpointing.py: the tracker file of the --load folder names the iteration loaded")]
        return tracker + [_cmd("resume", f"--load {_q(root)} --ckpt-step {iteration}", fw,
                               "Megatron-LM training config: ckpt_step, the checkpoint step to load")]
    if fw == "deepspeed" and _DS_TAG.match(name) and not remote:
        return [_cmd("resume", f"echo {name} > {_q(os.path.join(root, 'latest'))}", fw,
                     "DeepSpeed engine.load_checkpoint: without a tag it loads the one the 'latest' file names "
                     f"(or pass tag='{name}')")]
    if fw == "lightning":
        return [_cmd("resume", f"--ckpt_path {_q(path)}", fw,
                     "Lightning Trainer.fit(model, ckpt_path=...) / LightningCLI fit --ckpt_path")]
    if fw == "torchtitan" and step is not None:
        return [_cmd("resume", f"--checkpoint.load_step {step}", fw,
                     "torchtitan job config Checkpoint.load_step (-1: the latest)")]
    return []


def _timeout(fw: str | None) -> dict[str, Any]:
    if fw == "hf":
        return _cmd("timeout", "--ddp_timeout 7200", fw, "transformers TrainingArguments.ddp_timeout (seconds, default 1800)")
    if fw == "megatron":
        return _cmd("timeout", "--distributed-timeout-minutes 120", fw,
                    "Megatron-LM training config distributed_timeout_minutes (default 10)")
    if fw == "deepspeed":
        return _cmd("timeout", "deepspeed.init_distributed(timeout=datetime.timedelta(minutes=120))", fw,
                    "deepspeed/comm/comm.py init_distributed(timeout=...)")
    if fw == "lightning":
        return _cmd("timeout", "DDPStrategy(timeout=datetime.timedelta(minutes=120))", fw,
                    "Lightning DDPStrategy / FSDPStrategy timeout argument")
    return _cmd("timeout", "torch.distributed.init_process_group(backend, timeout=datetime.timedelta(minutes=120))", fw,
                "torch.distributed.init_process_group(timeout=...); NCCL's default is 10 minutes")


def _reshard(fw: str | None, path: str, saved: Any, current: Any) -> list[dict[str, Any]]:
    if path and (fw == "deepspeed" or _DS_TAG.match(os.path.basename(os.path.normpath(path)))):
        out = os.path.normpath(path) + "_universal"
        return [_cmd("reshard", f"python -m deepspeed.checkpoint.ds_to_universal --input_folder {_q(path)} "
                                f"--output_folder {_q(out)}", "deepspeed",
                     "deepspeed/checkpoint/ds_to_universal.py; then load it with "
                     "\"checkpoint\": {\"load_universal\": true} in the DeepSpeed config")]
    if saved:
        return [_cmd("reshard", f"relaunch with world size {saved} (torchrun --nnodes × --nproc-per-node = {saved})",
                     fw, f"the checkpoint was written by {saved} ranks; torch.distributed.checkpoint.load (DCP) "
                         f"reshards on load, a torch.save of local shards does not")]
    return []


def commands(inc: Incident) -> list[dict[str, Any]]:
    """The incident's commands (see the module docstring); [] for one without a checkpoint
    path (a ``verify`` needs the path) and nothing else to say."""
    fw = framework(inc)
    out: list[dict[str, Any]] = []
    path = inc.checkpoint_path
    cs = inc.checkpoint_state or {}
    lg = inc.last_good_checkpoint or {}
    remote = _url(path) if path else None
    if path and remote is None:
        out.append(_cmd("verify", f"ckptwatch verify {_q(path)}", None,
                        "ckptwatch verify: SHA-256 manifest and structural checks"))
    if path and inc.kind in SAVE_KINDS and inc.status == "open":
        if remote is None:
            folder = checkpoint_dir(path)
            out.append(_cmd("quarantine", f"mv {_q(folder)} {_q(os.path.normpath(folder) + '.partial')}", None,
                            "not every rank finished writing it: keep newest-checkpoint discovery off it"))
        elif remote[0] in _STORE_MV:
            url = remote[1].rstrip("/")
            out.append(_cmd("quarantine", _STORE_MV[remote[0]].format(src=_q(url), dst=_q(url + ".partial")), None,
                            f"not every rank finished writing it: move the prefix aside with the {remote[0]} "
                            "store's own tool (a local mv cannot)"))
    if inc.kind == "world_size_mismatch":
        out += _reshard(fw, remote[1] if remote else path or "", cs.get("saved_world_size"),
                        cs.get("current_world_size"))
    good = lg.get("path")
    good_remote = _url(good) if good else None
    if good and inc.kind != "post_resume_regression":
        if good_remote is None:
            out.append(_cmd("verify", f"ckptwatch verify {_q(good)}", None,
                            "verify the last good checkpoint before resuming from it"))
            out += _resume(fw, good, lg.get("step"))
        else:
            out += _resume(fw, good_remote[1], lg.get("step"), remote=True)
    rc = inc.root_cause
    if rc is not None and rc.cls == "collective_timeout" and inc.kind in SAVE_KINDS:
        out.append(_timeout(fw))
    return out
