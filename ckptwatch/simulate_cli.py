"""Command line of the fleet simulator: ``ckptwatch simulate`` (see :mod:`ckptwatch.simulate`).

    ckptwatch simulate OUT [--jobs 8] [--nodes 2] [--ranks 8] [--steps 120] [--save-every 40]
                           [--failures 0.5] [--kind sigkill --kind oom ...] [--layout console|rank-files]
                           [--seed 1] [--skew-ms 500]
    ckptwatch simulate OUT --kafka HOST:PORT [--rate EVENTS_PER_S]   # its events straight to the events topic
    ckptwatch simulate OUT --score DIAGNOSIS.json   # diagnose --json output scored against OUT/truth.json

With ``--kafka`` (topics and client settings from ``--config`` and ``CKPTWATCH_*``), the
fleet is also read as its collectors would read it and its events published to the events topic at
``--rate`` events/s (see :mod:`ckptwatch.simulate_kafka`): a load test of detectors and
sinks with no files tailed.

Exit codes: 0 written (or, with ``--score``, every injected incident found with its cause
and rank and none false), 1 the score falls short, 2 usage or input error (one line): a bad
option, an ``OUT/logs`` that already holds logs, a file that is not the truth or a
diagnosis, a diagnosis naming none of the truth's jobs, no broker answering.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from ckptwatch import config as config_mod
from ckptwatch.config import Config
from ckptwatch.simulate import FAILURES, FleetSpec, check_out, generate, score
from ckptwatch.simulate_live import write_live

_out = Console(emoji=False, highlight=False, soft_wrap=True)  # commands stay on one line to paste
_err = Console(stderr=True, emoji=False, highlight=False, soft_wrap=True)


def simulate_cmd(
    out: Annotated[Path, typer.Argument(help="Directory to write logs/ and truth.json into (created).")],
    jobs: Annotated[int, typer.Option("--jobs", help="Jobs in the fleet.")] = 8,
    nodes: Annotated[int, typer.Option("--nodes", help="Nodes per job.")] = 2,
    ranks: Annotated[int, typer.Option("--ranks", help="Ranks (GPUs) per node.")] = 8,
    steps: Annotated[int, typer.Option("--steps", help="Iterations per job, one a second.")] = 120,
    save_every: Annotated[int, typer.Option("--save-every", help="Iterations between saves.")] = 40,
    failures: Annotated[float, typer.Option("--failures", help="Share of jobs (0..1) with an injected "
                                                             "failure in a save.")] = 0.5,
    kind: Annotated[list[str] | None, typer.Option("--kind", help=f"Failure kinds to draw from (repeat): "
                                                              f"{', '.join(FAILURES)}; default all.")] = None,
    layout: Annotated[str, typer.Option("--layout", help="console: one torchrun --tee console per node; "
                                                         "rank-files: a file per rank beside it.")] = "console",
    seed: Annotated[int, typer.Option("--seed", help="Same seed, same fleet.")] = 1,
    skew_ms: Annotated[int, typer.Option("--skew-ms", help="Each host's clock is off by up to this many ms either "
                                                          "way (drawn per host, recorded in truth.json): two "
                                                          "hosts of a job up to twice that apart.")] = 500,
    rate: Annotated[float | None, typer.Option("--rate", help="Write live: append the lines in the order they "
                                                            "were written (not by their hosts' skewed stamps) "
                                                            "at this many lines/s in total (and write "
                                                            "OUT/live.json), instead of all at once. With "
                                                            "--kafka: events/s published.")] = None,
    kafka: Annotated[str | None, typer.Option("--kafka", help="Publish the fleet's events to this Kafka "
                                                              "(HOST:PORT[,...]) as its collectors would, and "
                                                              "write OUT/kafka.json.")] = None,
    config: Annotated[str | None, typer.Option("--config", help="TOML config file for --kafka's topics and "
                                                                "client settings (default $CKPTWATCH_CONFIG).")] = None,
    partitions: Annotated[int | None, typer.Option("--partitions", help="Partitions of an events topic created "
                                                                         "because it is missing (default 6).")] = None,
    rotate_mb: Annotated[float | None, typer.Option("--rotate-mb", help="Live: rotate a file past this many MB "
                                                                      "(renamed to <file>.1).")] = None,
    score_file: Annotated[Path | None, typer.Option("--score", help="Score this diagnose --json output against "
                                                                    "OUT/truth.json instead of writing.")] = None,
) -> None:
    """Write a simulated training fleet's logs with injected checkpoint failures and their
    ground truth (a load test and a demo: diagnose it, run it, score it)."""
    if score_file is not None:
        raise typer.Exit(_score(out / "truth.json", score_file))
    spec = FleetSpec(jobs=jobs, nodes_per_job=nodes, ranks_per_node=ranks, steps=steps, save_every=save_every,
                     failures=failures, kinds=tuple(kind or FAILURES), layout=layout, seed=seed, skew_ms=skew_ms)
    cfg = _kafka_config(kafka, config, partitions)
    try:
        spec.check()
        if rate is not None and not rate > 0:
            raise ValueError(f"--rate must be more than 0, not {rate:g}")
        check_out(out)  # before a broker is waited for or anything is said
        if cfg is not None:
            if rotate_mb:
                raise ValueError("--rotate-mb is for files written live, not for --kafka")
            truth = _publish(out, spec, cfg, rate)
        elif rate is not None:
            _out.print(f"writing live at {rate:,.0f} lines/s into {out / 'logs'} (Ctrl-C stops)")
            live = write_live(out, spec, rate=rate, rotate_bytes=int(rotate_mb * 2**20) if rotate_mb else None)
            truth = live["truth"]
        else:
            truth = generate(out, spec)
    except ValueError as e:
        _err.print(f"[red]error:[/red] {escape(str(e))}")
        raise typer.Exit(2) from None
    except OSError as e:
        _err.print(f"[red]error:[/red] {escape(f'{out}: cannot write: {e.strerror or e}')}")
        raise typer.Exit(2) from None
    injected = sum(len(j["incidents"]) for j in truth["jobs"].values())
    # rotated consoles no longer hold the line that named their job (the first generation's top,
    # rotated away): the directory names it
    path_template = truth["template"] or ("{job}/*/*" if rate is not None and rotate_mb else None)
    template = f" --path-template '{path_template}'" if path_template else ""
    _out.print(f"{_n(len(truth['jobs']), 'job')} x {_n(nodes, 'node')} x {_n(ranks, 'rank')}: "
               f"{truth['files']:,} files, {truth['lines']:,} lines in {out / 'logs'}; "
               f"{_n(injected, 'injected failure')} in {out / 'truth.json'}")
    _out.print(f"diagnose: ckptwatch diagnose --json{template} {out / 'logs'} > diagnosis.json")
    _out.print(f"score:    ckptwatch simulate {out} --score diagnosis.json")


def _kafka_config(kafka: str | None, path: str | None, partitions: int | None) -> Config | None:
    """The config to publish with (``--kafka`` names the broker; topics and client settings
    from ``path``, ``$CKPTWATCH_CONFIG`` and ``CKPTWATCH_*``), None without ``--kafka``."""
    if kafka is None:
        return None
    from ckptwatch.kafka.configuration import check_client_keys

    try:
        cfg = config_mod.load(path, flags={"kafka": {"bootstrap_servers": kafka, "partitions": partitions}})
        if not cfg.kafka.enabled:
            raise config_mod.ConfigError(f"--kafka {kafka}: Kafka is not enabled by the configuration")
        check_client_keys(cfg.kafka)
    except config_mod.ConfigError as e:
        _err.print(f"[red]error:[/red] {escape(str(e))}")
        raise typer.Exit(2) from None
    return cfg


def _publish(out: Path, spec: FleetSpec, cfg: Config, rate: float | None) -> dict[str, Any]:
    """Publish the fleet's events (:func:`publish_fleet`), saying where and how fast."""
    from ckptwatch.ingest.layout import compile_template
    from ckptwatch.kafka.admin import BrokerUnavailable
    from ckptwatch.simulate import RANK_FILES_TEMPLATE
    from ckptwatch.simulate_kafka import publish_fleet

    template = compile_template(RANK_FILES_TEMPLATE) if spec.layout == "rank-files" else None
    where = f"{cfg.kafka.events_topic} at {cfg.kafka.bootstrap_servers}"
    _out.print(f"publishing to {where}" + (f" at {rate:,.0f} events/s" if rate else ""))
    try:
        done = publish_fleet(out, spec, cfg, rate=rate, template=template,
                             on_wait=lambda msg: _err.print(escape(msg)))
    except BrokerUnavailable as e:
        raise ValueError(str(e)) from None
    _out.print(f"published {done['events']:,} events in {done['messages']:,} messages in {done['seconds']:.1f} s "
               f"({done['events_per_s'] or 0:,} events/s) to {where}; figures in {out / 'kafka.json'}")
    return dict(done["truth"])


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _score(truth_path: Path, diagnosis: Path) -> int:
    truth = _read_json(truth_path, "the truth simulate wrote")
    got = _read_json(diagnosis, "a diagnose --json output")
    if truth is None or got is None:
        return 2
    incidents = got.get("incidents") if isinstance(got, dict) else got
    if not isinstance(truth, dict) or not isinstance(truth.get("jobs"), dict):
        _err.print(f"[red]error:[/red] {escape(f'{truth_path}: not the truth.json simulate writes (no jobs)')}")
        return 2
    if not isinstance(incidents, list):
        _err.print(f"[red]error:[/red] {escape(f'{diagnosis}: not a diagnose --json output (no incidents list)')}")
        return 2
    try:
        result = score(truth, incidents)
    except ValueError as e:
        _err.print(f"[red]error:[/red] {escape(f'{diagnosis}: {e}')}")
        return 2
    r = result
    _out.print(f"injected {r['injected']}: found {r['found']}, with the right cause and rank {r['exact']}; "
               f"false incidents {r['false']}; clean jobs {r['clean_jobs']}, with an incident "
               f"{r['clean_with_incident']}")
    for key in ("missed", "wrong", "false_jobs"):
        if r[key]:
            _out.print(f"{key.replace('_', ' ')}: {', '.join(r[key][:10])}{' …' if len(r[key]) > 10 else ''}")
    return 0 if r["exact"] == r["injected"] and not r["false"] else 1


def _read_json(path: Path, what: str) -> Any:
    """The JSON document at ``path``; None after saying why it cannot be read (one line)."""
    try:
        return json.loads(path.read_text())
    except OSError as e:
        _err.print(f"[red]error:[/red] {escape(f'{path}: cannot read: {e.strerror or e}')}")
    except (ValueError, UnicodeDecodeError) as e:
        _err.print(f"[red]error:[/red] {escape(f'{path}: not JSON ({what}): {e}')}")
    return None


def register(app: typer.Typer) -> None:
    """Add ``simulate`` to the ``ckptwatch`` application."""
    app.command("simulate")(simulate_cmd)
