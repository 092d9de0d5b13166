"""The vocabulary corpus: what frameworks print, read from their source, one line a row.

``tests/vocab/<family>.tsv`` holds log lines that trainers, launchers, storage clients and
the kernel really print (a framework's save, load and failure wordings, each rendered as it
appears with the framework's default logging prefix), with the kind of event a reader would
call each line. It measures the rule layer's **vocabulary** the way the wild corpus
measures whole diagnoses: a wording that no rule knows is a miss on every log that uses it,
whatever else the log shows. Rows come from source code only (``source`` names the file and
function of the logging call), so the corpus grows by reading frameworks, not by tuning to
pasted cases.

Columns (tab-separated, ``#`` starts a comment, the first row is the header)::

    framework   source                                  expect      step  line
    keras       keras-team/keras ... ModelCheckpoint._save_model   save_start  3     Epoch 3: saving model to ckpt/weights.03.h5

``expect`` is an event kind of :data:`ckptwatch.schema.EVENT_KINDS` or ``none`` (benign:
looks alarming or save-like, is neither); ``step`` the step the line carries (empty when it
has none). :func:`classify` reads every row as a one-line paste through the real ingest and
rule path (prefix stripping, time parsing, the packs of the given scopes).
"""

from __future__ import annotations

import csv
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ckptwatch.schema import EVENT_KINDS

#: Event kinds a row's ``expect`` may also be met by: the same fact told by another layer.
ACCEPT: dict[str, frozenset[str]] = {
    "save_error": frozenset({"save_error", "storage_error"}),
    "job_signal": frozenset({"job_signal", "agent_signal"}),
    "process_exit": frozenset({"process_exit", "job_failed", "job_end", "job_signal", "agent_signal"}),
    "collective_error": frozenset({"collective_error", "collective_timeout"}),
    "resume": frozenset({"resume", "load_start"}),
    "load_start": frozenset({"load_start", "resume"}),
    "oom_kill": frozenset({"oom_kill", "host_memory"}),
    "host_memory": frozenset({"host_memory", "oom_kill"}),
}
#: Kinds that a ``none`` row may yield without counting as a false reading (they state no
#: failure, save or load).
HARMLESS = frozenset({"metric", "world_size", "retry", "integrity", "job_end"})
HEADER = ("framework", "source", "expect", "step", "line")


@dataclass(frozen=True)
class VocabRow:
    """One row of a vocabulary file: ``where`` is ``file:line`` for messages."""
    family: str
    framework: str
    source: str
    expect: str
    step: int | None
    line: str
    where: str


@dataclass(frozen=True)
class Reading:
    """What the rule layer made of a row: the kinds and steps of its events, in order."""
    row: VocabRow
    kinds: tuple[str, ...]
    steps: tuple[int | None, ...]
    rules: tuple[str, ...]

    @property
    def hit(self) -> bool:
        """The row's kind was read (a ``none`` row: nothing but :data:`HARMLESS` kinds)."""
        if self.row.expect == "none":
            return all(k in HARMLESS for k in self.kinds)
        return bool(ACCEPT.get(self.row.expect, frozenset({self.row.expect})) & set(self.kinds))

    @property
    def step_right(self) -> bool:
        """A hit whose expected step (when the row gives one) is among the events' steps."""
        return self.hit and (self.row.expect == "none" or self.row.step is None or self.row.step in self.steps)


def load_vocab(directory: Path) -> list[VocabRow]:
    """Every row of ``directory/*.tsv`` (the family is the file's stem).

    Raises ValueError naming ``file:line`` for a bad header, a row that has not five
    columns, an ``expect`` that is no event kind or a step that is no integer."""
    rows: list[VocabRow] = []
    for path in sorted(directory.glob("*.tsv")):
        with path.open(encoding="utf-8", newline="") as fh:
            lines = [(n, ln.rstrip("\n")) for n, ln in enumerate(fh, 1) if ln.strip() and not ln.startswith("#")]
        if not lines or tuple(lines[0][1].split("\t")) != HEADER:
            raise ValueError(f"{path}:1: the header must be {' '.join(HEADER)!r} (tab-separated)")
        for n, cols in ((n, next(csv.reader([ln], delimiter="\t", quoting=csv.QUOTE_NONE))) for n, ln in lines[1:]):
            where = f"{path.name}:{n}"
            if len(cols) != 5:
                raise ValueError(f"{where}: {len(cols)} columns, want 5 ({', '.join(HEADER)})")
            framework, source, expect, step, line = (c.strip() for c in cols)
            if expect != "none" and expect not in EVENT_KINDS:
                raise ValueError(f"{where}: expect {expect!r} is no event kind and not 'none'")
            if step and not step.isdigit():
                raise ValueError(f"{where}: step {step!r} is not a whole number")
            rows.append(VocabRow(path.stem, framework, source, expect, int(step) if step else None, line, where))
    return rows


def classify(rows: Sequence[VocabRow], scopes: Iterable[str] | None = None) -> list[Reading]:
    """Read each row as its own one-line paste (a file of its own, so no row wraps, prefixes
    or dates another) through :class:`~ckptwatch.ingest.watcher.SourceWatcher` and the
    packaged packs of ``scopes`` (all when None); one :class:`Reading` per row, in order."""
    from ckptwatch.ingest.watcher import SourceWatcher
    from ckptwatch.rules import RuleSet

    rules = RuleSet.load(scopes=tuple(scopes) if scopes is not None else None)
    found: dict[int, list[tuple[str, int | None, str]]] = {i: [] for i in range(len(rows))}
    with tempfile.TemporaryDirectory(prefix="ckptwatch-vocab-") as tmp:
        for i, row in enumerate(rows):
            Path(tmp, f"{i:05d}.log").write_text(row.line + "\n", encoding="utf-8")
        watcher = SourceWatcher([tmp], archives=False, watch_changes=False)
        while True:
            records = watcher.poll(final=True)
            file_of = dict(zip(records["source_id"], records["file"]))
            for ev in rules.apply(records).iter_rows(named=True):
                found[int(Path(file_of[ev["source_id"]]).stem)].append((ev["kind"], ev["step"], ev["rule_id"]))
            if not watcher.backlog:
                break
    return [Reading(row, tuple(k for k, _, _ in found[i]), tuple(s for _, s, _ in found[i]),
                    tuple(r for _, _, r in found[i])) for i, row in enumerate(rows)]

