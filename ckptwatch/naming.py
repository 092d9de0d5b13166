"""How trainers name checkpoints: the step a checkpoint path carries, by convention only.

A number in a path is a step only where a trainer's naming convention puts one, so that a
run directory such as ``/ckpt/run-17`` or ``/models/gpt-7b`` is never read as step 17 or 7:

==========================  ====================================================  ============================
convention                  example                                               written by
==========================  ====================================================  ============================
``checkpoint-N``            ``out/checkpoint-500``                                HF Trainer (``PREFIX_CHECKPOINT_DIR``)
``global_stepN``            ``ckpt/global_step20/mp_rank_00_model_states.pt``     DeepSpeed ``save_checkpoint`` tag
``iter_NNNNNNN``            ``/ckpt/iter_0000040``                                Megatron-LM ``get_checkpoint_name``
``step=N`` / ``step-N``     ``epoch=0-step=20.ckpt``, ``checkpoint/step-400``     Lightning ``ModelCheckpoint``, NeMo, torchtitan
``step_N``, ``ckpt_step_N`` ``/ckpt/step_10``, ``ckpt_step_30.pt``                plain loops
``checkpoint_E_N``          ``checkpoints/checkpoint_1_1000.pt``                  fairseq (epoch, updates)
``baN``                     ``ep0-ba100-rank0.pt``                                Composer ``save_filename``
``model_NNNNNNN``           ``output/model_0004999.pth``                          detectron2 ``PeriodicCheckpointer`` (7 digits)
``save-N-E-S``              ``…-2025-05-13_20-46-50-save-50-2-0.safetensors``     OneTrainer (global step, epoch, epoch step)
``epoch_N.*`` (a file)      ``work_dirs/epoch_12.pth``, ``epoch=3.ckpt``          mmengine / mmcv ``CheckpointHook`` (by epoch), Lightning
==========================  ====================================================  ============================

A file named by an epoch and no step (``epoch_12.pth``, ``epoch=3.ckpt``) is a trainer that
counts in epochs: the epoch is the checkpoint's step. With a step beside it
(``epoch=3-step=500``) the step wins; a folder named by an epoch (torchtune's ``epoch_0``,
whose run logs its steps) names no step.

Ray Train v1's ``checkpoint_000003`` (six zero-padded digits after an underscore) counts
reports, not steps (ray/train/_internal/storage.py ``_get_checkpoint_dir_name``), and
tf.train.CheckpointManager's ``ckpt-12`` counts saves: neither names a step.

The nearest component to the end of the path that follows a convention gives the step
(``out/checkpoint-20/pytorch_model_fsdp_0`` -> 20).

Some shard names carry the world size that wrote them: verl's FSDP checkpoint manager
(verl/utils/checkpoint/fsdp_checkpoint_manager.py ``save_checkpoint``) writes
``model_world_size_{world_size}_rank_{rank}.pt`` (and ``optim_``, ``extra_state_``), read by
:func:`world_size_from_path`.
"""

from __future__ import annotations

import re

#: One path component's step, by the conventions in the module docstring.
STEP_IN_NAME = re.compile(
    r"(?i)(?:^|[^a-z0-9])(?:(?:checkpoint|ckpt)[-_=]|global_step|iter|iteration|step|steps|ba)[-_=]?0*(\d{1,12})(?!\d)"
)
#: fairseq's ``checkpoint_{epoch}_{updates}.pt`` (checkpoint_utils.save_checkpoint): the updates
#: are the step; its ``checkpoint{epoch}.pt`` (no separator) names an epoch, no step
FAIRSEQ_UPDATES = re.compile(r"(?i)(?:^|[^a-z0-9])checkpoint_\d+_(\d{1,12})(?!\d)")


#: detectron2's PeriodicCheckpointer: '{}_{:07d}'.format(file_prefix, iteration), prefix 'model'
#: (fvcore/common/checkpoint.py); seven digits, so that 'model_7b' or 'model_2' is no step
DETECTRON2_ITER = re.compile(r"(?i)(?:^|[^a-z0-9])model_(\d{7})(?!\d)")
#: OneTrainer's GenericTrainer save name: '{prefix}{timestamp}-save-{global_step}-{epoch}-{epoch_step}'
#: (modules/util/TrainProgress.py filename_string)
ONETRAINER_SAVE = re.compile(r"(?i)-save-(\d{1,12})-\d+-\d+(?!\d)")
#: an epoch-counting trainer's name (mmengine CheckpointHook ``epoch_{n}.pth``, Lightning
#: ``epoch={epoch}.ckpt``): the epoch is the step when the name has no step
EPOCH_IN_NAME = re.compile(r"(?i)(?:^|[^a-z0-9])epoch[-_=]?0*(\d{1,6})(?!\d)")
#: a file's name (``epoch_12.pth``), not a folder's: torchtune's ``epoch_0/`` folders hold a
#: run that logs its steps, and their epoch would read as a step of another count
_HAS_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,11}$")


_RAY_INDEX = re.compile(r"checkpoint_\d{6}")
#: tf.train.CheckpointManager's default names, ``ckpt-{save_counter}`` (checkpoint_management.py
#: CheckpointManager.save: ``checkpoint_name='ckpt'``, numbered by the save counter unless
#: ``checkpoint_number`` is passed): a count of saves, not a step (Estimator's ``model.ckpt-N``
#: is the global step)
_TF_SAVE_COUNTER = re.compile(r"ckpt-\d+(?:_temp(?:[/\\].*)?|\.index|\.data-\d+-of-\d+)?")


#: verl's FSDP shard name: '{model,optim,extra_state}_world_size_{world_size}_rank_{rank}.pt'
WORLD_SIZE_IN_NAME = re.compile(r"(?i)(?:^|[^a-z0-9])world_size_(\d{1,6})_rank_(\d{1,6})(?!\d)")


def world_size_from_path(path: str | None) -> int | None:
    """The world size a shard's file name states (``…/model_world_size_8_rank_3.pt`` -> 8), or
    None when it states none, or states a rank not below it (a name of another meaning)."""
    if not path:
        return None
    m = WORLD_SIZE_IN_NAME.search(path.rsplit("/", 1)[-1])
    if m is None or int(m.group(2)) >= int(m.group(1)) or int(m.group(1)) == 0:
        return None
    return int(m.group(1))


def step_from_path(path: str | None) -> int | None:
    """The step a checkpoint ``path`` names by convention (see the module docstring), from
    its last component that has one; None when no component does."""
    if not path:
        return None
    for part in reversed(re.split(r"[/\\]+", path.strip().rstrip("/\\"))):
        if _RAY_INDEX.fullmatch(part) or _TF_SAVE_COUNTER.fullmatch(part):
            continue
        m = (FAIRSEQ_UPDATES.search(part) or STEP_IN_NAME.search(part) or DETECTRON2_ITER.search(part)
             or ONETRAINER_SAVE.search(part))
        if m:
            return int(m.group(1))
    name = re.split(r"[/\\]+", path.strip())[-1]
    if _HAS_EXTENSION.search(name) and (m := EPOCH_IN_NAME.search(name)):
        return int(m.group(1))
    return None


def checkpoint_of(token: str) -> str | None:
    """The checkpoint a path-like token names: the token up to its last component that names
    a step (``ckpt/global_step20/mp_rank_00_model_states.pt`` -> ``ckpt/global_step20``: the
    checkpoint, not one of its files; trailing punctuation of the line dropped), or None when
    no component names one (:func:`step_from_path` per component)."""
    parts = token.rstrip("/.,;:'\")]").split("/")
    for n in range(len(parts), 0, -1):
        if step_from_path(parts[n - 1]) is not None:
            return "/".join(parts[:n])
    return None


#: a file name that is a checkpoint's or one of its files' (torch, safetensors, DCP, Keras / h5,
#: TF's SaveV2 shards and index, Paddle, flax msgpack, darknet weights, Caffe)
CKPT_FILE_NAME = re.compile(
    r"\.(?:pt|pth|safetensors|ckpt|distcp|h5|hdf5|keras|msgpack|pdparams|pdopt|weights|caffemodel|t7)$"
    r"|(?:model|optim|weights|state|rank|shard)[\w.-]*\.(?:bin|npz)$"
    r"|\.data-\d{5}-of-\d{5}|\.index$|^variables_temp|^latest\.")


def names_checkpoint(path: str) -> bool:
    """``path`` names a checkpoint or one of its files: a component names a step
    (:func:`checkpoint_of`: ``global_step40``, ``checkpoint-500``, ``epoch_12.pth``), or its
    file name has a checkpoint's extension or shape (:data:`CKPT_FILE_NAME`). Not a logger's
    or a cache's file (``/tmp/wandb/…/output.log``, ``~/.cache/huggingface/hub``)."""
    if checkpoint_of(path) is not None:
        return True
    return any(CKPT_FILE_NAME.search(part) for part in re.split(r"[/\\]+", path.strip().rstrip("/")) if part)
