"""How much of the frameworks' own vocabulary the rule layer reads (tests/vocab, see ckptwatch.vocab).

Each row of tests/vocab/*.tsv is a line a framework prints, taken from its source, with the
kind of event a reader would call it. Every row is read as a one-line paste twice: with every
pack, and generic only (the framework packs turned off: the system and generic packs, as on a
stack with no pack of its own). Printed per family and per expected kind: rows, read right
(kind), step right (when the row gives one), and false readings of benign rows.

    python benchmarks/vocab.py [--misses] [--kind KIND] [--family FAMILY]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

from ckptwatch.vocab import classify, load_vocab

ROOT = Path(__file__).resolve().parent.parent
GENERIC_ONLY = ("system", "generic")


def _pct(n: int, d: int) -> str:
    return f"{100 * n / d:.0f} %" if d else "-"


def table(readings, generic, key) -> list[tuple]:
    """Rows of (group, rows, kind right, step right / rows with a step, generic kind right, benign read as something)."""
    groups: dict[str, list] = defaultdict(list)
    for r, g in zip(readings, generic):
        groups[key(r.row)].append((r, g))
        groups["all"].append((r, g))
    out = []
    for name in sorted(groups, key=lambda k: (k == "all", k)):
        pairs = groups[name]
        stepped = [(r, g) for r, g in pairs if r.row.step is not None and r.row.expect != "none"]
        out.append((name, len(pairs), _pct(sum(r.hit for r, _ in pairs), len(pairs)),
                    _pct(sum(r.step_right for r, _ in stepped), len(stepped)),
                    _pct(sum(g.hit for _, g in pairs), len(pairs)),
                    sum(1 for r, _ in pairs if r.row.expect == "none" and not r.hit)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--misses", action="store_true", help="list every row read wrong (all packs)")
    ap.add_argument("--generic", action="store_true", help="with --misses: the generic-only misses")
    ap.add_argument("--kind", help="only rows expecting this kind")
    ap.add_argument("--family", help="only rows of this family (file stem)")
    args = ap.parse_args()
    rows = [r for r in load_vocab(ROOT / "tests" / "vocab")
            if (not args.kind or r.expect == args.kind) and (not args.family or r.family == args.family)]
    t0 = time.perf_counter()
    full = classify(rows)
    generic = classify(rows, GENERIC_ONLY)
    took = time.perf_counter() - t0
    head = ("rows", "kind right", "step right", "generic-only kind right", "benign read as an event")
    for title, key in (("family", lambda r: r.family), ("expected kind", lambda r: r.expect)):
        print(f"{title:<20}" + "".join(f"{h:>26}" for h in head))
        for name, *cols in table(full, generic, key):
            print(f"{name:<20}" + "".join(f"{str(c):>26}" for c in cols))
        print()
    print(f"{len(rows)} rows from {len({r.framework for r in rows})} frameworks, read twice in {took:.1f} s")
    if args.misses:
        for r in (generic if args.generic else full):
            if not r.step_right:
                print(f"MISS {r.row.where:<22} want {r.row.expect}/{r.row.step} got {list(zip(r.kinds, r.steps))} "
                      f"{r.row.line[:150]}")


if __name__ == "__main__":
    main()
