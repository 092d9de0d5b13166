"""Labels from line prefixes and JSON fields, vectorized.

Launchers and schedulers wrap each worker line in their own label; they are read and
removed outermost first, so the same worker line read from a console and from the
per-rank file under ``--log-dir`` is the same text:

==================  ===========================  ===========================================
layout              prefix                       label (semantics)
==================  ===========================  ===========================================
JSON lines          ``{"rank": 3, "msg": …}``    ``rank``/``local_rank``/``host``/``pid``/
                                                 ``job`` fields; the text becomes
                                                 ``<time> <level> <message>``
pdsh                ``node-a: ``                 host (pdsh(1): "output is prefixed by the
                                                 hostname"); only when the file is laid out
                                                 so (:func:`sniff`)
srun ``--label``    ``3: `` / `` 3: ``           global rank: Slurm's task id, padded to the
                                                 width of the largest (srun(1) ``-l``); only
                                                 when the file is laid out so (:func:`sniff`)
host:task           ``[node-a:3]: ``             host and global rank (task id)
host:rank           ``node-a:3: ``               host and global rank (torchrun
                                                 ``--log-line-prefix-template "${hostname}:${rank}: "``,
                                                 the example of torch/distributed/run.py);
                                                 only when the file is laid out so
torchrun ``[N]:``   ``[3]: ``                    global rank (template ``[${rank}]:``)
user template       ``--line-prefix '…'``        exactly what its macros say (read first)
Open MPI            ``[1,3]<stdout>:``           global rank (``mpirun --tag-output``)
Ray                 ``(RayTrainWorker pid=N,     pid and host (the ip); Ray's worker log
                    ip=10.0.0.2) ``              prefix
kubectl             ``[pod/job-worker-0/c] ``    host: the pod (``kubectl logs --prefix``;
                                                 outermost, read first)
torchrun ``--tee``  ``[default2]:``,             local rank: ``[<role><local_rank>]:``; with
                    ``[trainer2]:``              ``--role rank`` it reads ``[rank2]:`` too
                                                 (see below); ``[trainer2|5]:`` (a template
                                                 of the same shape) gives local rank 2
c10d excepthook     ``[rank3]:``                 global rank (``torch.distributed`` prefixes
                                                 an uncaught exception's lines after
                                                 ``init_process_group``)
verl                ``[rank-3]: ``               global rank (verl/utils/checkpoint/
                                                 fsdp_checkpoint_manager.py ``save_checkpoint``
                                                 prints ``f"[rank-{self.rank}]: Saving …"``)
==================  ===========================  ===========================================

``[rankN]:[rankM]:`` is ``--tee`` with ``--role rank`` followed by the excepthook: N is
the local rank and M the global one. A lone leading ``[rankN]:`` is taken as global
unless the caller knows the file is a multi-node torchrun console (``rank_prefix_is_local``).

Inside the line (the first 96 characters), a logger format may name the rank too:
``[rank2]``, ``[rank1/4]``, Lightning's ``[rank: 0]``, DeepSpeed's and NCCL's ``[Rank 1]``,
``rank=3`` / ``global_rank=3`` key-values (see :func:`inline_rank`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

JSON_KEYS = {
    "message": ("message", "msg", "text", "log", "event"),
    "time": ("timestamp", "time", "ts", "@timestamp", "asctime", "datetime"),
    "level": ("level", "levelname", "severity"),
    "rank": ("rank", "global_rank", "RANK"),
    "local_rank": ("local_rank", "LOCAL_RANK"),
    "host": ("host", "hostname", "node", "nodename"),
    "pid": ("pid", "process"),
    "job": ("job", "job_id", "run_id", "jobid"),
}
HOST_PREFIX_RE = r"^(?P<host>[A-Za-z0-9][A-Za-z0-9._-]*): "
HOST_RANK_RE = r"^(?P<host>[A-Za-z0-9][A-Za-z0-9._-]*):(?P<rank>\d{1,6}): "
BARE_RANK_RE = r"^\[(?P<rank>\d{1,6})\]: ?"
ROLE_PAIR_RE = r"^\[(?P<role>[A-Za-z_][A-Za-z_-]*?)(?P<local_rank>\d+)[|:,/](?P<other>\d+)\]:"
TASK_PREFIX_RE = r"^ *(?P<task>\d{1,6}): "
HOST_TASK_RE = r"^\[(?P<host>[A-Za-z0-9][A-Za-z0-9._-]*):(?P<task>\d{1,6})\]:? ?"
OMPI_RE = r"^\[\d+,(?P<task>\d{1,6})\]<(?:stdout|stderr)>: ?"
#: ``kubectl logs --prefix`` (kubectl pkg/cmd/logs/logs.go ``addPrefixIfNeeded``: ``"[pod/%s/%s] "``,
#: the pod's and the container's names): the outermost prefix, read first; the pod is the host
KUBECTL_RE = r"^\[pod/(?P<pod>[^/\]\s]+)/[^\]\s]*\] "
RAY_RE = r"^ *\((?P<actor>[A-Za-z_][\w.]*) pid=(?P<pid>\d+)(?:, ip=\[?(?P<ip>[0-9A-Fa-f.:]+)\]?)?\) "
TEE_RE = r"^\[(?P<role>[A-Za-z_][A-Za-z_-]*?)(?P<local_rank>\d+)\]:"
RANK_RE = r"^\[rank-?(?P<rank>\d+)\]:[ ]?"
DOUBLE_RANK_RE = r"^\[rank(?P<local>\d+)\]:\[rank(?P<rank>\d+)\]:"

#: a torchrun agent's own line (glog format): its pid (torch/distributed/elastic logging)
AGENT_PID = r"^\[?[IWEF]\d{3,4} \d{2}:\d{2}:\d{2}(?:\.\d+)? +(?P<pid>\d+) torch/distributed/"
#: Slurm's own lines in a job's output (srun's, slurmstepd's): never labelled, whatever the tasks' lines are
_SLURM_OWN = re.compile(r"(?:srun|slurmstepd|sbatch|salloc|slurmd)(?:\[\d+\])?: ")
_GLOG_AGENT = r"[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d+ +\d+ torch/distributed/"
# words that start log lines as "WORD: text" and are not host names
_NOT_HOSTS = {"info", "warning", "warn", "error", "debug", "critical", "fatal", "note", "notice", "trace",
              "traceback", "exception", "epoch", "step", "loss", "http", "https", "file", "usage", "hint"}


@dataclass(frozen=True)
class PrefixLayout:
    """How a file's lines are labelled, decided once per file from its first lines
    (:func:`sniff`): ``host_prefix`` (pdsh's ``host: ``), ``task_prefix`` (srun's ``N: ``;
    ``task_is_launcher`` when the tasks are torchrun agents, one per node),
    ``host_rank_prefix`` (torchrun ``--log-line-prefix-template "${hostname}:${rank}: "``);
    ``template``: a user's torchrun prefix template (:func:`compile_line_prefix`), read
    exactly, before anything else."""

    host_prefix: bool = False
    task_prefix: bool = False
    host_rank_prefix: bool = False
    task_is_launcher: bool = False  # srun started one torchrun per node: the task is a node, not a rank
    template: str | None = None
    #: prefixes nobody registered, learned from the file's own tracebacks (:func:`learn_outer`):
    #: anchored regexes, removed first; what they removed is kept for the line's time
    outer: tuple[str, ...] = ()


_MACROS = {"role_name": r"(?P<role>[A-Za-z_][A-Za-z_-]*?)", "local_rank": r"(?P<local_rank>\d+)",
           "rank": r"(?P<rank>\d+)", "hostname": r"(?P<host>[A-Za-z0-9][A-Za-z0-9._-]*?)"}


class LinePrefixError(ValueError):
    """A line prefix template that cannot be used (names the template and the reason)."""


def compile_line_prefix(template: str) -> str:
    """A torchrun ``--log-line-prefix-template`` (macros ``${role_name}``, ``${local_rank}``,
    ``${rank}``, ``${hostname}``; torch/distributed/run.py) as an anchored regex with named
    groups. Raises LinePrefixError for an unknown macro or a template without one."""
    out, pos, seen = ["^"], 0, set()
    for m in re.finditer(r"\$\{([^}]*)\}", template):
        name = m.group(1)
        if name not in _MACROS:
            raise LinePrefixError(f"line prefix template {template!r}: unknown macro ${{{name}}}; "
                                  "known: ${role_name}, ${local_rank}, ${rank}, ${hostname}")
        if name in seen:
            raise LinePrefixError(f"line prefix template {template!r}: ${{{name}}} appears twice")
        seen.add(name)
        out += [re.escape(template[pos:m.start()]), _MACROS[name]]
        pos = m.end()
    if not seen:
        raise LinePrefixError(f"line prefix template {template!r}: no macro (${{rank}}, ${{local_rank}}, ...)")
    out.append(re.escape(template[pos:]))
    return "".join(out)


#: where a message starts that is known whatever wraps it: a traceback's header, a frame line
#: (CPython's traceback.print_exception), a torchrun / c10d rank label
_ANCHOR = re.compile(r'Traceback \(most recent call last\)|(?<=\S)(?:\s{1,8})File "[^"\n]+", line \d+'
                     r'|(?<=\S)\[(?:rank|default|trainer)\d+\]:')
#: known labels a prefix may end with (read by :func:`split_prefixes` once the outer part is gone)
_KNOWN_TAIL = re.compile("|".join(f"(?:{re.sub(r'[(][?]P<[a-z_]+>', '(?:', x[1:])})" for x in (
    TEE_RE, RANK_RE, BARE_RANK_RE, HOST_TASK_RE, OMPI_RE, RAY_RE, KUBECTL_RE, ROLE_PAIR_RE, TASK_PREFIX_RE,
    HOST_RANK_RE)))
#: what an outer prefix must not be: an exception's name, a logger's level, a frame, a quote
_NOT_OUTER = re.compile(r"(?:Error|Exception|Warning|Traceback|File|raise|assert|return|:\s*\w+)\W*$|^\s*$|^[#|*\-\s]+$"
                        r"|^\s*[{\"']")
#: the start of a paste cut inside a label: ``rank0]:``, ``efault1]:`` (the ``[`` and part of the word lost)
_CUT_LABEL = r"^[A-Za-z_]{0,12}\d{1,6}\]: ?"
#: lines of a file the outer prefixes are learned from, and lines one must wrap to be believed
LEARN_LINES, MIN_SUPPORT = 4000, 3


def _shape(text: str) -> str:
    """An anchored regex (Rust and Python syntax alike) for prefixes shaped like ``text``:
    its digits any number, its other characters as they are (a host name, a job-runner's
    words, a container's stream), then the one space or tab that separates it from the
    message (CloudWatch's and journald exports' fields are tab-separated)."""
    out = []
    for part in re.split(r"(\d+)", text):
        if part.isdigit():
            out.append(r"\d+")
        else:
            out.append(re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", part))
    return "^" + "".join(out) + r"[ \t]?"


def _without_known_labels(pre: str) -> str:
    """``pre`` less the labels :func:`split_prefixes` reads itself at its end (``0: [rank0]:``:
    srun's, then the excepthook's), right to left."""
    while pre:
        tail = next((j for j in range(len(pre)) if (j == 0 or pre[j - 1] in " \t]:|)")
                     and (_KNOWN_TAIL.fullmatch(pre[j:] + " ") or _KNOWN_TAIL.fullmatch(pre[j:]))), None)
        if tail is None:
            return pre
        pre = pre[:tail].rstrip()
    return pre


def learn_outer(lines: list[str] | pl.Series) -> tuple[str, ...]:
    """Prefixes nobody registered, from a file's own lines: where a traceback's header, a
    frame line or a rank label (:data:`_ANCHOR`) does not start its line, what comes before
    it is a wrapper (a CI runner's ``9-task-1-0/0 ``, ``srun --output``'s ``host:0 out: ``,
    a container runtime's ``<time> stdout F ``, Docker Compose's ``trainer_1  | ``). The part
    up to a label :func:`split_prefixes` knows (``[default0]:``) is cut off that label; its
    shape (:func:`_shape`: digits generalized) is kept when at least :data:`MIN_SUPPORT`
    of the first :data:`LEARN_LINES` lines start with it. A first line cut inside a label
    (``rank0]:``) is one too. Returns anchored regexes, most lines first; empty when nothing
    is learned. Only the lines that hold an anchor's literal are looked at one by one; the
    shapes are counted over the sample in one pass each."""
    sample = (lines if isinstance(lines, pl.Series) else pl.Series(lines, dtype=pl.Utf8)).head(LEARN_LINES)
    if sample.is_empty():
        return ()
    first = sample[0] or ""
    anchored = sample.filter(sample.str.contains_any(["Traceback (most recent call last)", 'File "', "]:"]))
    shapes: set[str] = set()
    for ln in anchored.to_list():
        m = _ANCHOR.search(ln)
        if m is None or m.start() == 0:
            continue
        outer = _without_known_labels(ln[:m.start()].rstrip())
        if outer and len(outer) <= 96 and not _NOT_OUTER.search(outer):
            shapes.add(_shape(outer))
    support = {s: int(sample.str.contains(s).sum()) for s in shapes}
    kept = sorted((s for s, n in support.items() if n >= MIN_SUPPORT), key=lambda s: (-support[s], s))
    if re.match(_CUT_LABEL, first) and not any(re.match(s, first) for s in kept):
        kept.append(_CUT_LABEL)
    return tuple(kept)


def sniff(lines: list[str], *, min_share: float = 0.8) -> PrefixLayout:
    """Decide from a file's first lines (up to a few hundred) whether every line carries
    pdsh's ``host: `` or srun ``--label``'s ``N: `` prefix: at least ``min_share`` of the
    non-blank lines do (Slurm's own ``srun: ``/``slurmstepd: `` lines not counted; pdsh:
    with host-like names: a digit, ``-`` or ``.``, or ``localhost``). srun's labels also
    pass at half the lines when they name several task ids (the ``\r``-separated updates of
    a task's progress bar are unlabelled). Prefixes this ambiguous are never read from a
    stray line."""
    body = [ln for ln in lines if ln.strip() and not _SLURM_OWN.match(ln)]
    if len(body) < 2:
        return PrefixLayout()
    need = max(2, int(len(body) * min_share))
    host_re, task_re = re.compile(HOST_PREFIX_RE), re.compile(TASK_PREFIX_RE)
    if sum(1 for ln in body if re.match(HOST_RANK_RE, ln)) >= max(2, len(body) // 4):
        return PrefixLayout(host_rank_prefix=True)  # distinctive: the agent's own lines may lack it
    hosts = [m.group("host") for ln in body if (m := host_re.match(ln))]
    hostlike = [h for h in hosts if h.lower() not in _NOT_HOSTS and (
        any(c.isdigit() or c in "-." for c in h) or h == "localhost") and not h.isdigit()]
    rest = [ln[len(h) + 2:] for ln, h in zip(body, hosts, strict=False)] if len(hostlike) >= need else body
    matches = [m for ln in rest if (m := task_re.match(ln))]
    tasked = [m.string[m.end():] for m in matches]
    # srun labels a line at its start only: the \r-separated updates of a progress bar, a
    # task's unlabelled stray lines lower the share; several task ids are srun's mark
    ids = {m.group("task") for m in matches}
    task_prefix = len(tasked) >= max(2, int(len(rest) * min_share)) or (
        len(tasked) >= max(4, len(rest) // 2) and len(ids) >= 2)
    launcher = any(re.match(TEE_RE, ln) and not ln.startswith("[rank") or re.match(_GLOG_AGENT, ln) for ln in tasked)
    return PrefixLayout(host_prefix=len(hostlike) >= need, task_prefix=task_prefix, task_is_launcher=launcher)


def node_key(host_label: pl.Expr) -> pl.Expr:
    """Which node a line is from, for a file's rank map (after :func:`split_prefixes`): its
    host or srun-task label, else the file's host label (``host_label``, Utf8), else one node
    per file (empty)."""
    return pl.coalesce(pl.col("prefix_node"), host_label.fill_null(""))


def labelled(layout: PrefixLayout) -> bool:
    """The layout found a label prefix on the file's lines (pdsh, srun, host:rank)."""
    return layout.host_prefix or layout.task_prefix or layout.host_rank_prefix


def _json_fields(text: pl.Expr) -> dict[str, pl.Expr]:
    """The first present key of each :data:`JSON_KEYS` entry, as strings (null if none)."""
    out = {}
    for name, keys in JSON_KEYS.items():
        out[name] = pl.coalesce([text.str.json_path_match(f"$.{k}") if k[0].isalpha() else
                                 text.str.json_path_match(f"$['{k}']") for k in keys])
    return out


_EPOCH_MIN_S = -62_135_596_800.0  # 0001-01-01T00:00:00Z
_EPOCH_MAX_S = 253_402_300_799.0  # 9999-12-31T23:59:59Z


def _json_time(value: pl.Expr) -> pl.Expr:
    """A JSON time field as text the timestamp parser reads: ISO strings as they are,
    epoch seconds (or ms) as ISO 8601 UTC."""
    num = value.cast(pl.Float64, strict=False)
    secs = pl.when(num > 1e11).then(num / 1000).otherwise(num)
    # only years 1..9999 are times (polars panics formatting a year past 262143)
    secs = pl.when(secs.is_between(_EPOCH_MIN_S, _EPOCH_MAX_S)).then(secs)
    epoch = pl.from_epoch((secs * 1e6).cast(pl.Int64, strict=False), time_unit="us").dt.strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
    return pl.when(num.is_not_null()).then(epoch).otherwise(value)


def _json_columns(df: pl.DataFrame, text_col: str, is_json: pl.Expr) -> pl.DataFrame:
    """The ``_j_*`` columns of JSON lines (null elsewhere), and ``text_col`` replaced by a
    JSON line's message."""
    line = pl.col(text_col)
    js = _json_fields(line)
    # the message is read like any line (a torchrun prefix inside a container's log); its
    # time and level go in front of what is left of it at the end
    json_head = pl.concat_str([_json_time(js["time"]).fill_null(""), js["level"].fill_null("")],
                              separator=" ").str.strip_chars()
    return df.with_columns(
        pl.when(is_json & js["message"].is_not_null()).then(json_head).alias("_j_head"),
        pl.when(is_json).then(js["rank"]).cast(pl.Int32, strict=False).alias("_j_rank"),
        pl.when(is_json).then(js["local_rank"]).cast(pl.Int32, strict=False).alias("_j_local"),
        pl.when(is_json).then(js["host"]).alias("_j_host"),
        pl.when(is_json).then(js["pid"]).cast(pl.Int64, strict=False).alias("_j_pid"),
        pl.when(is_json).then(js["job"]).alias("_j_job"),
        pl.when(is_json & js["message"].is_not_null()).then(js["message"].str.strip_chars_end("\n"))
        .otherwise(line).alias(text_col),
    )


def split_prefixes(df: pl.DataFrame, text_col: str = "line", *, layout: PrefixLayout = PrefixLayout(),
                   rank_prefix_is_local: bool = False) -> pl.DataFrame:
    """Add ``prefix_local_rank``, ``prefix_rank`` (Int32), ``prefix_host`` (Utf8),
    ``prefix_pid`` (Int64) and ``prefix_job`` (Utf8), null when absent, and
    ``prefix_stream`` (Utf8: the writer's labels, not the excepthook's ``[rankN]:``, so a
    traceback stays in its worker's stream) and ``prefix_node`` (Utf8: the host, or the srun
    task of a launcher, whose rendezvous result maps local ranks), and strip the prefixes from ``text_col`` (see
    the module docstring for the order and semantics)."""
    line = pl.col(text_col)
    if layout.outer:  # wrappers nobody registered, learned from the file: off first, kept for the time
        rx = "|".join(f"(?:{o})" for o in layout.outer)
        df = df.with_columns(line.str.extract(f"({rx})", 1).alias("prefix_outer"), line.str.replace(rx, ""))
    else:
        df = df.with_columns(pl.lit(None, dtype=pl.Utf8).alias("prefix_outer"))
    # a wrapper that names a rank (``rank3: ``, ``worker-rank-3 | ``) still gives it
    df = df.with_columns(pl.col("prefix_outer").str.extract(r"(?i)\brank[ _-]?(\d{1,6})\b", 1)
                         .cast(pl.Int32, strict=False).alias("_o_rank"))
    df = df.with_columns(line.str.extract(KUBECTL_RE, 1).alias("_k_host"), line.str.replace(KUBECTL_RE, ""))
    is_json = line.str.starts_with("{") & line.str.ends_with("}")
    if not df.select(is_json.any()).item():  # no JSON line in the batch (most files): no JSON paths to read
        df = df.with_columns(
            pl.lit(None, dtype=pl.Utf8).alias("_j_head"), pl.lit(None, dtype=pl.Int32).alias("_j_rank"),
            pl.lit(None, dtype=pl.Int32).alias("_j_local"), pl.lit(None, dtype=pl.Utf8).alias("_j_host"),
            pl.lit(None, dtype=pl.Int64).alias("_j_pid"), pl.lit(None, dtype=pl.Utf8).alias("_j_job"))
    else:
        df = _json_columns(df, text_col, is_json)
    host_parts: list[pl.Expr] = [pl.col("_j_host")]
    rank_parts: list[pl.Expr] = [pl.col("_j_rank"), pl.col("_o_rank")]
    local_parts: list[pl.Expr] = []
    extra: list[str] = []
    if layout.template:  # the user's own torchrun template: its macros say exactly what each number is
        rx = compile_line_prefix(layout.template)
        g = line.str.extract_groups(rx).struct
        names = re.findall(r"\(\?P<(\w+)>", rx)
        df = df.with_columns(
            *[g.field(n).alias(f"_u_{n}") for n in names], line.str.replace(rx, "").alias(text_col))
        extra += [f"_u_{n}" for n in names]
        if "host" in names:
            host_parts.append(pl.col("_u_host"))
        if "rank" in names:
            rank_parts.append(pl.col("_u_rank").cast(pl.Int32, strict=False))
        if "local_rank" in names:
            local_parts.append(pl.col("_u_local_rank").cast(pl.Int32, strict=False))
    if layout.host_rank_prefix:
        hr = line.str.extract_groups(HOST_RANK_RE).struct
        df = df.with_columns(hr.field("host").alias("_hr_host"), hr.field("rank").cast(pl.Int32, strict=False)
                             .alias("_hr_rank"), line.str.replace(HOST_RANK_RE, "").alias(text_col))
        host_parts.append(pl.col("_hr_host"))
        rank_parts.append(pl.col("_hr_rank"))
        extra += ["_hr_host", "_hr_rank"]
    if layout.host_prefix:
        df = df.with_columns(line.str.extract(HOST_PREFIX_RE, 1).alias("_h_host"),
                             line.str.replace(HOST_PREFIX_RE, ""))
        host_parts.append(pl.col("_h_host"))
    if layout.task_prefix:  # srun's task id: a rank, unless the task is a launcher (a torchrun per node)
        df = df.with_columns(line.str.extract(TASK_PREFIX_RE, 1).cast(pl.Int32, strict=False).alias("_t_task"),
                             line.str.replace(TASK_PREFIX_RE, ""))
        launcher = pl.lit(layout.task_is_launcher)
        df = df.with_columns(pl.when(~launcher).then(pl.col("_t_task")).alias("_t_rank"),
                             pl.when(launcher).then(pl.format("srun task {}", pl.col("_t_task"))).alias("_t_node"))
        rank_parts.append(pl.col("_t_rank"))
        extra += ["_t_task", "_t_node"]
    ht = line.str.extract_groups(HOST_TASK_RE)
    bare = pl.when(line.str.contains(r"^\[\d{1,6}\]: ?\S")).then(line.str.extract(BARE_RANK_RE, 1))
    df = df.with_columns(
        ht.struct.field("host").alias("_ht_host"),
        ht.struct.field("task").cast(pl.Int32, strict=False).alias("_ht_rank"),
        line.str.extract(OMPI_RE, 1).cast(pl.Int32, strict=False).alias("_mpi_rank"),
        bare.cast(pl.Int32, strict=False).alias("_bare_rank"),
    ).with_columns(
        pl.when(pl.col("_bare_rank").is_not_null()).then(line.str.replace(BARE_RANK_RE, "")).otherwise(line)
        .str.replace(HOST_TASK_RE, "").str.replace(OMPI_RE, "").alias(text_col))
    ray = line.str.extract_groups(RAY_RE)
    df = df.with_columns(
        ray.struct.field("pid").cast(pl.Int64, strict=False).alias("_ray_pid"),
        ray.struct.field("ip").alias("_ray_host"),
        line.str.replace(RAY_RE, ""),
    )
    host_parts += [pl.col("_ht_host"), pl.col("_ray_host"), pl.col("_k_host")]
    rank_parts += [pl.col("_ht_rank"), pl.col("_mpi_rank"), pl.col("_bare_rank")]
    pair = line.str.extract_groups(ROLE_PAIR_RE).struct
    df = df.with_columns(  # [<role><local_rank>|<n>]: a template of the default's shape: the first number is local
        pair.field("local_rank").cast(pl.Int32, strict=False).alias("_pair_local"),
        line.str.replace(ROLE_PAIR_RE, "").alias(text_col))
    local_parts.append(pl.col("_pair_local"))
    tee = line.str.extract_groups(TEE_RE)
    is_tee = tee.struct.field("role").is_not_null() & ~tee.struct.field("role").is_in(["rank", "rank-"])
    dbl = line.str.extract_groups(DOUBLE_RANK_RE)
    is_dbl = dbl.struct.field("local").is_not_null()
    df = df.with_columns(
        pl.when(is_tee).then(tee.struct.field("local_rank").cast(pl.Int32, strict=False))
        .when(is_dbl).then(dbl.struct.field("local").cast(pl.Int32, strict=False)).alias("_tee_local"),
        pl.when(is_tee).then(line.str.replace(TEE_RE, ""))
        .when(is_dbl).then(line.str.replace(r"^\[rank\d+\]:", "")).otherwise(line).alias(text_col),
    )
    lone = line.str.extract(RANK_RE, 1).cast(pl.Int32, strict=False)
    df = df.with_columns(lone.alias("_lone_rank"), line.str.replace(RANK_RE, "").alias(text_col))
    if rank_prefix_is_local:  # ``--role rank`` on a multi-node console: the lone prefix is --tee's
        local = pl.coalesce(*local_parts, pl.col("_tee_local"), pl.when(~is_dbl).then(pl.col("_lone_rank")),
                            pl.col("_j_local"))
        rank_parts.append(pl.when(is_dbl).then(pl.col("_lone_rank")))
    else:
        local = pl.coalesce(*local_parts, pl.col("_tee_local"), pl.col("_j_local"))
        rank_parts.append(pl.col("_lone_rank"))
    task = pl.coalesce([pl.col(c) for c in ("_j_rank", "_ht_rank", "_mpi_rank", "_bare_rank")]
                       + ([pl.col("_t_task")] if layout.task_prefix else [])
                       + ([pl.col("_hr_rank")] if layout.host_rank_prefix else [])
                       + ([pl.col("_u_rank").cast(pl.Int32, strict=False)] if "_u_rank" in extra else []))
    # a lone ``[rankN]:`` with no writer's label (a console without --tee: the worker's own
    # rank prefix, as on its uncaught-exception traceback) keeps two ranks' interleaved
    # tracebacks apart
    lone_only = pl.when(local.is_null() & task.is_null() & pl.coalesce(host_parts).is_null()).then(pl.col("_lone_rank"))
    stream = pl.concat_str([pl.coalesce(host_parts).fill_null(""), local.cast(pl.Utf8).fill_null(""),
                            task.cast(pl.Utf8).fill_null(""), pl.col("_ray_pid").cast(pl.Utf8).fill_null(""),
                            lone_only.cast(pl.Utf8).fill_null("")], separator="|")
    node = pl.coalesce(pl.coalesce(host_parts), *([pl.col("_t_node")] if layout.task_prefix else []))
    is_j = pl.col("_j_head").is_not_null() & (pl.col("_j_head") != "")
    out = df.with_columns(
        pl.when(is_j).then(pl.concat_str([pl.col("_j_head"), line], separator=" ")).otherwise(line).alias(text_col),
        node.alias("prefix_node"),
        stream.alias("prefix_stream"),
        local.cast(pl.Int32).alias("prefix_local_rank"),
        pl.coalesce(rank_parts).cast(pl.Int32).alias("prefix_rank"),
        pl.coalesce(host_parts).cast(pl.Utf8).alias("prefix_host"),
        pl.coalesce(pl.col("_j_pid"), pl.col("_ray_pid")).alias("prefix_pid"),
        pl.col("_j_job").alias("prefix_job"),
    )
    return out.drop(["_j_head", "_j_rank", "_o_rank", "_j_local", "_j_host", "_j_pid", "_j_job", "_ht_host", "_ht_rank",
                     "_mpi_rank", "_bare_rank", "_pair_local", "_ray_pid", "_ray_host", "_k_host", "_tee_local",
                     "_lone_rank", *extra] + (["_h_host"] if layout.host_prefix else []) + (["_t_rank"] if layout.task_prefix else []))


INLINE_RANK_RE = (
    r"(?:\[rank(?P<a>\d+)(?:/\d+)?\]|\[rank: (?P<b>\d+)\]|\[Rank (?P<c>\d+)\]"
    r"|(?:^|[\s,;(\[{|])(?:global_)?rank[=:] ?(?P<d>\d+)\b"
    r"|: rank(?P<e>\d+)\[\d+\]\[)"  # llm-foundry / Composer scripts: '%(asctime)s: rank0[pid][thread]: ...'
)


def inline_rank(text: pl.Expr) -> pl.Expr:
    """Rank named by a logger format inside the first 96 characters: ``[rank2]``,
    ``[rank1/4]``, Lightning's ``[rank: 0]`` (``rank_prefixed_message``), DeepSpeed's
    ``log_dist`` and NCCL's ``[Rank 1]``, ``rank=3`` / ``global_rank=3`` / ``rank: 3``, and
    llm-foundry's ``2026-11-30 10:00:00,123: rank1[5151][MainThread]: INFO: ...`` (the format
    of mosaicml/llm-foundry scripts/train.py, used with Composer)."""
    g = text.str.slice(0, 96).str.extract_groups(INLINE_RANK_RE).struct
    return pl.coalesce(g.field("a"), g.field("b"), g.field("c"), g.field("d"), g.field("e")).cast(pl.Int32,
                                                                                                  strict=False)
