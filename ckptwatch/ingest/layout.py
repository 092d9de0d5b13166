"""Labels from a file's path.

Three sources, strongest first:

1. a user-given path template such as ``{job}/{host}/rank{rank}.log`` (fields ``job``,
   ``host``, ``rank``, ``local_rank``, ``attempt``; ``*`` matches within one path part),
   matched against the end of the path;
2. torchrun's own ``--log-dir`` layout:
   ``<log_dir>/<run_id>_<8 random chars>/attempt_<n>/<local_rank>/{stdout,stderr}.log``
   (``run_id`` is the job, see ``torch.distributed.elastic.multiprocessing``; torchrun's
   default run id ``none`` is shared by every run, so then the directory name is);
3. a file named after its rank (``rank3.log``, ``rank_3.out``, ``train-rank3.txt``; see
   :data:`RANK_FILE_RE`): that rank, the job from its lines or the directory's other files;
   Paddle's launcher's ``workerlog.N`` (:data:`PADDLE_WORKERLOG_RE`): local rank N;
   a template's match and a rank file's name allow a rotated copy's suffix (``.1``, ``.gz``);
4. a Kubernetes container log (:data:`K8S_POD_RES`): its pod is its host;
5. a Slurm batch output file, ``slurm-<jobid>.out`` / ``slurm-<jobid>_<task>.out``
   (sbatch's default ``--output``): the job is ``slurm-<jobid>[_<task>]`` unless a line
   of the file names one (a torchrun ``run_id``, which its ``--log-dir`` files carry too);
6. for a torchrun console file (``console.log`` or any file beside a ``--log-dir``), the
   run id of the single torchrun run directory next to it (in ``torchrun_logs/``,
   ``logs/``, ``log_dir/``, right beside it, or in any directory beside it that holds
   ``<run_id>_<rand>/attempt_N/``, as ``accelerate launch --log_dir`` writes).

Labels found in the lines themselves (``job_id=…``, ``[rank3]:``) are applied later and
win over path labels for ``rank``; the job of a console file with no path label is taken
from the first line that names it (``run_id : …`` or ``job_id=…``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

TORCHRUN_RE = re.compile(
    r"(?:^|/)(?P<run_id>[^/]+)_(?P<rand>[a-z0-9_]{8})/attempt_(?P<attempt>\d+)/(?P<local_rank>\d+)/"
    r"(?P<stream>stdout|stderr)\.log$"
)
#: what logrotate and its kin add to a rotated file's name (``.1``, ``-20261130``, ``.gz``): the
#: copy is the same rank's file
ROTATED = r"(?:[.-]\d{1,8})?(?:\.gz)?"
#: a file named after its rank: ``rank3.log``, ``rank_3.out``, ``train-rank-3.txt`` (and their rotated copies)
RANK_FILE_RE = re.compile(r"(?:^|/|[._-])rank[_-]?(?P<rank>\d{1,6})(?:\.(?:log|out|err|txt))?" + ROTATED + "$",
                          re.IGNORECASE)
#: Kubernetes container logs, whose pod is their host (its hostname): the kubelet's
#: ``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log``, the node's
#: ``/var/log/containers/<pod>_<namespace>_<container>-<container id>.log`` symlinks, and a
#: ``kubectl logs <pod> > <pod>.log`` of a PyTorchJob / MPIJob pod (``<job>-worker-3``), and a
#: ``kubectl describe pod <pod>`` saved as ``describe-pod-<pod>.txt`` (or ``describe-<pod>``)
K8S_POD_RES = (
    re.compile(r"(?:^|/)[a-z0-9][a-z0-9-]*_(?P<pod>[a-z0-9][a-z0-9.-]*)_[0-9a-f-]{8,}/[^/]+/\d+\.log" + ROTATED + "$"),
    re.compile(r"(?:^|/)(?P<pod>[a-z0-9][a-z0-9.-]*)_[a-z0-9][a-z0-9-]*_[a-z0-9][a-z0-9-]*-[0-9a-f]{4,64}\.log$"),
    re.compile(r"(?:^|/)(?:describe[-_](?:pods?[-_])?)?(?P<pod>[A-Za-z0-9][\w.-]*-(?:master|worker|launcher)-\d+)"
               r"(?:\.(?:log|out|txt))?" + ROTATED + "$"),
)
#: PaddlePaddle's launcher (paddle/distributed/fleet/launch_utils.py start_local_trainers, and
#: paddle.distributed.launch after it): each local trainer's output in ``<log_dir>/workerlog.<idx>``
PADDLE_WORKERLOG_RE = re.compile(r"(?:^|/)workerlog\.(?P<local_rank>\d{1,6})" + ROTATED + "$")
SLURM_OUT_RE = re.compile(r"(?:^|/)(?P<job>slurm-\d+(?:_\d+)?)\.(?:out|err)$")
_FIELD_RE = re.compile(r"\{(job|host|rank|local_rank|attempt)\}")
_INT_FIELDS = ("rank", "local_rank", "attempt")


class TemplateError(ValueError):
    """A path template that cannot be compiled (names the template and the reason)."""


@dataclass(frozen=True)
class PathLabels:
    """Labels of one file. ``source_kind`` is ``worker`` (one rank's output), ``console``
    (torchrun's combined output with ``[defaultN]:`` prefixes) or ``log`` (anything else:
    kernel and storage logs included; their rules recognise them by content)."""

    job: str | None = None
    host: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    attempt: int | None = None
    source_kind: str = "log"
    fallback_job: str | None = None  # the job when no line of the file names one


def compile_template(template: str) -> re.Pattern[str]:
    """Compile ``{job}/{host}/rank{rank}.log`` into a regex matched at the end of a path.

    Raises TemplateError for unknown fields or a field used twice.
    """
    unknown = set(re.findall(r"\{([^}]*)\}", template)) - {"job", "host", "rank", "local_rank", "attempt"}
    if unknown:
        raise TemplateError(f"path template {template!r}: unknown field(s) {sorted(unknown)}; "
                            "known: job, host, rank, local_rank, attempt")
    stray = _FIELD_RE.sub("", template)
    if "{" in stray or "}" in stray:
        raise TemplateError(f"path template {template!r}: unbalanced '{{' or '}}'")
    out, pos, seen = [], 0, set()
    for m in _FIELD_RE.finditer(template):
        out.append(re.escape(template[pos:m.start()]).replace(r"\*", "[^/]*"))
        name = m.group(1)
        if name in seen:
            raise TemplateError(f"path template {template!r}: field {{{name}}} appears twice")
        seen.add(name)
        out.append(rf"(?P<{name}>\d+)" if name in _INT_FIELDS else rf"(?P<{name}>[^/]+?)")
        pos = m.end()
    out.append(re.escape(template[pos:]).replace(r"\*", "[^/]*"))
    return re.compile(r"(?:^|/)" + "".join(out) + ROTATED + "$")


def _torchrun_run_dirs(log_dir: str, *, with_attempts: bool = False) -> list[str]:
    """The jobs of the torchrun run directories (``<run_id>_<8 chars>``) in ``log_dir``;
    ``with_attempts``: only those holding an ``attempt_N`` directory (when ``log_dir`` is
    not a log dir by name)."""
    try:
        names = sorted(os.listdir(log_dir))
    except OSError:
        return []
    out = []
    for n in names:
        m = re.fullmatch(r"(?P<run_id>.+)_(?P<rand>[a-z0-9_]{8})", n)
        path = os.path.join(log_dir, n)
        if m and os.path.isdir(path) and (not with_attempts or any(
                a.startswith("attempt_") for a in _listdir(path))):
            out.append(_job_of_run_dir(m.group("run_id"), m.group("rand")))
    return out


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _job_of_run_dir(run_id: str, rand: str) -> str:
    """The job a torchrun ``--log-dir`` run directory stands for: its run id, unless that is
    torchrun's default ``none`` (no ``--rdzv-id``), which every such run shares: then the
    directory's name (``none_h_tq81hv``), unique per run."""
    return f"{run_id}_{rand}" if run_id == "none" else run_id


def labels_for(path: str, template: re.Pattern[str] | None = None) -> PathLabels:
    """Labels for the file at ``path`` (see module docstring for the order)."""
    norm = path.replace(os.sep, "/")
    if template is not None:
        m = template.search(norm)
        if m:
            g = m.groupdict()
            return PathLabels(
                job=g.get("job"),
                host=g.get("host"),
                rank=int(g["rank"]) if g.get("rank") else None,
                local_rank=int(g["local_rank"]) if g.get("local_rank") else None,
                attempt=int(g["attempt"]) if g.get("attempt") else None,
                source_kind="worker" if g.get("rank") or g.get("local_rank") else "log",
            )
    m = TORCHRUN_RE.search(norm)
    if m:
        return PathLabels(
            job=_job_of_run_dir(m.group("run_id"), m.group("rand")),
            local_rank=int(m.group("local_rank")),
            attempt=int(m.group("attempt")),
            source_kind="worker",
        )
    m = SLURM_OUT_RE.search(norm)
    if m:
        return PathLabels(fallback_job=m.group("job"), source_kind="console")
    m = RANK_FILE_RE.search(norm)
    if m:
        return PathLabels(rank=int(m.group("rank")), source_kind="worker")
    m = PADDLE_WORKERLOG_RE.search(norm)
    if m:
        return PathLabels(local_rank=int(m.group("local_rank")), source_kind="worker")
    for pod_re in K8S_POD_RES:
        m = pod_re.search(norm)
        if m:
            return PathLabels(host=m.group("pod"))
    parent = os.path.dirname(path)
    run_ids = []
    for sub in ("torchrun_logs", "logs", "log_dir"):
        run_ids += _torchrun_run_dirs(os.path.join(parent, sub))
    run_ids += _torchrun_run_dirs(parent, with_attempts=True)  # the run directory right beside it
    if not run_ids:  # any other --log-dir beside it (accelerate_logs/, my_logs/): run dirs with attempts
        for sub in sorted(_listdir(parent))[:64]:
            if os.path.isdir(os.path.join(parent, sub)):
                run_ids += _torchrun_run_dirs(os.path.join(parent, sub), with_attempts=True)
    is_console = os.path.basename(path) == "console.log" or bool(run_ids)
    job = run_ids[0] if len(set(run_ids)) == 1 else None
    return PathLabels(job=job, source_kind="console" if is_console else "log")
