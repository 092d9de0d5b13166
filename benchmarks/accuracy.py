#!/usr/bin/env python3
"""Diagnosis accuracy over every scenario the repository holds, per framework and layout.

    .venv/bin/python benchmarks/accuracy.py [--markdown] [--verbose] [--only SUBSTRING] [--heldback]
    .venv/bin/python benchmarks/accuracy.py --wild [--markdown] [--verbose] [--heldback]

Runs ``diagnose`` (the embedded pipeline, as the CLI does) over each case of
:func:`ckptwatch.groundtruth.load_cases`: the shared corpus (``examples/corpus``), the real
framework runs (``tests/fixtures/realruns``, each launch layout on its own) and the
hand-written scenarios (``tests/scenarios``, those still ``pending-rules`` included), and
prints per framework:

* **recall**: expected incidents found (kind and step);
* **cause + rank**: expected incidents found with the right root-cause class and rank;
* **false**: incidents that match no expected one (on clean scenarios and elsewhere).

Targets (issue 13): recall >= 95 %, cause + rank >= 90 %, no false incident on a clean
scenario. ``--verbose`` lists each case's misses and extras.

Then, beside it, the wild corpus (``tests/wild``: real pasted logs, see
:mod:`ckptwatch.wild`), per framework family: the dev split with every pack and with
**generic only** (every framework pack turned off: the system and generic packs, as on a
stack ckptwatch has no pack for); with ``--heldback``, the held-back split the same way.
Held-back cases are scored in aggregate only, when a piece of work is done: ``--verbose``
lists misses of dev cases and never names a held-back one (whoever writes rules never
reads them). ``--wild`` prints the wild table alone. Targets (issue 37): dev recall
>= 95 %, cause + rank >= 90 %; held-back recall >= 85 %, cause + rank >= 75 %; generic
only, held-back, recall >= 70 %; 0 false.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckptwatch.groundtruth import Score, load_cases, restore_mtimes, score  # noqa: E402
from ckptwatch.pipeline import PipelineOptions, diagnose  # noqa: E402
from ckptwatch.wild import load_wild_cases  # noqa: E402

GENERIC_ONLY = ("system", "generic")


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.0f} %" if b else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--verbose", action="store_true", help="list each case's misses and false incidents")
    ap.add_argument("--only", default="", help="only cases whose name contains this")
    ap.add_argument("--wild", action="store_true", help="the wild corpus (tests/wild) alone")
    ap.add_argument("--heldback", action="store_true", help="score the held-back split too (aggregate only)")
    args = ap.parse_args()
    if args.wild:
        return wild(args)
    restore_mtimes(ROOT)  # undated lines are dated by their file's mtime, which a checkout loses
    cases = [c for c in load_cases(ROOT) if args.only in c.name]
    rows: dict[str, list[tuple[object, Score]]] = defaultdict(list)
    t0 = time.monotonic()
    for case in cases:
        incidents, _ = diagnose([str(case.logs)])
        s = score(case, [i.to_dict() for i in incidents])
        rows[case.framework].append((case, s))
        if args.verbose and (s.missed or s.extra):
            print(f"{case.source}/{case.name} [{case.layout}]: missed {[(m['kind'], m['step'], m['root_cause_class'], m['root_rank']) for m in s.missed]}"
                  f" extra {s.extra}")
    took = time.monotonic() - t0
    header = ["framework", "cases", "clean", "expected", "recall", "cause + rank", "false (clean)", "false (all)"]
    table = []
    tot = defaultdict(int)
    for fw in sorted(rows):
        items = rows[fw]
        clean = [s for c, s in items if not c.incidents]  # type: ignore[attr-defined]
        exp = sum(s.expected for _, s in items)
        found = sum(s.found for _, s in items)
        exact = sum(s.exact for _, s in items)
        false_clean = sum(s.false for s in clean)
        false_all = sum(s.false for _, s in items)
        table.append([fw, len(items), len(clean), exp, _pct(found, exp), _pct(exact, exp), false_clean, false_all])
        for k, v in (("cases", len(items)), ("clean", len(clean)), ("exp", exp), ("found", found), ("exact", exact),
                     ("fc", false_clean), ("fa", false_all)):
            tot[k] += v
    table.append(["all", tot["cases"], tot["clean"], tot["exp"], _pct(tot["found"], tot["exp"]),
                  _pct(tot["exact"], tot["exp"]), tot["fc"], tot["fa"]])
    _print_table(header, table, markdown=args.markdown)
    print(f"\n{tot['cases']} cases ({len(cases)} diagnoses) in {took:.1f} s; targets: recall >= 95 %, "
          "cause + rank >= 90 %, false (clean) = 0\n")
    return wild(args)


def _print_table(header: list[str], table: list[list], *, markdown: bool) -> None:
    """``table`` under ``header``, as Markdown or as aligned columns."""
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in table:
            print("| " + " | ".join(str(x) for x in r) + " |")
        return
    widths = [max(len(str(r[i])) for r in [header, *table]) for i in range(len(header))]
    for r in [header, *table]:
        print("  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(r, widths))))


def _wild_scores(cases, scopes) -> list:
    out = []
    for wc in cases:
        incidents, _ = diagnose([str(wc.case.logs)], PipelineOptions(rule_scopes=scopes))
        out.append((wc, score(wc.case, [i.to_dict() for i in incidents])))
    return out


def _cells(scored: list) -> list:
    """cases, clean, expected, recall, cause + rank, false incidents (all)"""
    if not scored:
        return [0, 0, 0, "-", "-", 0]
    exp = sum(s.expected for _, s in scored)
    return [len(scored), sum(1 for wc, _ in scored if not wc.case.incidents), exp,
            _pct(sum(s.found for _, s in scored), exp), _pct(sum(s.exact for _, s in scored), exp),
            sum(s.false for _, s in scored)]


def wild(args: argparse.Namespace) -> int:
    """The wild corpus per family: dev and held-back, every pack and generic only."""
    splits = ("dev", "heldback") if args.heldback else ("dev",)
    cases = [c for c in load_wild_cases(ROOT, splits) if args.only in c.case.name or c.split != "dev"]
    t0 = time.monotonic()
    runs = {(split, scope): _wild_scores([c for c in cases if c.split == split], scopes)
            for split in splits for scope, scopes in (("all", None), ("generic", GENERIC_ONLY))}
    took = time.monotonic() - t0
    if args.verbose:
        for scope in ("all", "generic"):
            for wc, s in runs[("dev", scope)]:
                if s.missed or s.false:
                    print(f"[{scope}] {wc.case.name} ({wc.framework}, {wc.completeness}): missed "
                          f"{[(m['kind'], m['step'], m['root_cause_class'], m['root_rank']) for m in s.missed]} "
                          f"extra {s.extra}")
    families = sorted({c.family for c in cases})
    header = ["family"]
    for split in splits:
        header += [f"{split} cases", f"{split} clean", f"{split} expected", f"{split} recall",
                   f"{split} cause + rank", f"{split} false", f"{split} generic-only recall",
                   f"{split} generic-only false"]
    table = []
    for fam in [*families, "all"]:
        row: list = [fam]
        for split in splits:
            pick = (lambda xs: xs) if fam == "all" else (lambda xs, f=fam: [x for x in xs if x[0].family == f])
            full, gen = pick(runs[(split, "all")]), pick(runs[(split, "generic")])
            g = _cells(gen)
            row += _cells(full) + [g[3], g[5]]
        table.append(row)
    _print_table(header, table, markdown=args.markdown)
    frameworks = {c.framework for c in cases}
    print(f"\n{len(cases)} wild cases from {len(frameworks)} frameworks and stacks, "
          f"{sum(1 for c in cases if not c.case.incidents)} clean, in {took:.1f} s; targets: dev recall >= 95 %, "
          "cause + rank >= 90 %; held-back recall >= 85 %, cause + rank >= 75 %; generic only (held-back) "
          "recall >= 70 %; false = 0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
