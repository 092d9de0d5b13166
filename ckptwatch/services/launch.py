"""Entry points of the fleet services, shared by the CLI and by ``ckptwatch run --kafka``.

Every function blocks until interrupted, or until ``until_idle`` seconds without work.
``say`` receives progress and warnings as sentences (the CLI prints them to stderr).
``metrics`` (optional) is the process's :class:`~ckptwatch.sinks.metrics.Metrics`, shared by
the services it runs.

An unreachable broker at start: every service waits, says so, hints at checking the address
after ``[kafka] connect_hint_after`` seconds and gives up after ``connect_timeout``
(BrokerUnavailable); with ``once`` (a batch job) it gives up at ``connect_hint_after``.
An interrupt (KeyboardInterrupt: Ctrl-C, or SIGTERM in the CLI) at any point, even while
a service is still being set up, closes what was opened, the alerter included, and
propagates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ckptwatch.config import Config
from ckptwatch.detectors import DetectorConfig, Incident
from ckptwatch.pipeline import PipelineOptions, detector_config
from ckptwatch.rules import RuleSet
from ckptwatch.services.collect import Collector
from ckptwatch.services.detect import DetectorMember
from ckptwatch.services.loop import run_steps
from ckptwatch.services.sink import SinkMember
from ckptwatch.sinks.alerts.dispatcher import Alerter
from ckptwatch.sinks.duckdb_store import Store
from ckptwatch.sinks.metrics import Metrics

Say = Callable[[str], None]


def for_once(config: Config) -> Config:
    """``config`` for a batch run (``--once``): no broker by ``connect_hint_after`` seconds
    is an error, not a reason to wait for ``connect_timeout``."""
    k = config.kafka
    return dataclasses.replace(config, kafka=dataclasses.replace(
        k, connect_timeout=min(k.connect_timeout, k.connect_hint_after)))


def collect(config: Config, options: PipelineOptions, *, once: bool, until_idle: float | None, say: Say,
            metrics: Metrics | None = None) -> Collector:
    """Run a collector; with ``once``, publish what the files hold now (last lines included)
    and return. Returns the collector (closed) for its stats."""
    collector = _collector(for_once(config) if once else config, options, say, metrics)
    try:
        if once:
            collector.step(final=True)
            while collector.watcher.backlog:  # every byte: a chunk of each file per step
                collector.step(final=True)
        else:
            run_steps([collector.step], interval=config.collect.interval, until_idle=until_idle)
    finally:
        collector.close()
    return collector


def _collector(config: Config, options: PipelineOptions, say: Say, metrics: Metrics | None) -> Collector:
    return Collector(config, rules=RuleSet.load(options.rule_files), template=options.template,
                     boot_time=options.boot_time, line_prefix=options.line_prefix, on_wait=say, metrics=metrics,
                     job=options.job)


def _detector(config: Config, options: PipelineOptions, say: Say, metrics: Metrics | None, *,
              base: DetectorConfig | None = None) -> DetectorMember:
    return DetectorMember(config, detector_config=detector_config(config.detect, base or options.detector),
                          on_message=say, metrics=metrics)


def detect(config: Config, options: PipelineOptions, *, until_idle: float | None, say: Say,
           metrics: Metrics | None = None) -> DetectorMember:
    """Run one detector group member; returns it (closed) for its stats. When
    ``until_idle`` ends the run, the input is taken as complete: the member concludes what
    waits for late evidence and publishes it before leaving (:meth:`DetectorMember.finish`)."""
    member = _detector(config, options, say, metrics)
    try:
        run_steps([member.step], interval=config.detect.interval, until_idle=until_idle)
        if until_idle is not None:
            member.finish()
    finally:
        member.close()
    return member


def sink(config: Config, store: Store, *, until_idle: float | None, say: Say,
         on_incident: Callable[[Incident], None] | None = None, metrics: Metrics | None = None,
         alerter: Alerter | None = None, started: Callable[[SinkMember], None] | None = None) -> SinkMember:
    """Run the DuckDB sink into ``store`` (the caller closes it), alerting through
    ``alerter`` (closed when this returns or raises); returns the member (closed).
    ``started`` gets the member once it exists (so a caller interrupted meanwhile can still
    read its counts)."""
    try:
        member = SinkMember(config, store, on_message=say, on_incident=on_incident, metrics=metrics,
                            alerter=alerter)
    except BaseException:  # no broker, or interrupted while waiting for one
        if alerter:
            alerter.close()
        raise
    if started is not None:
        started(member)
    try:
        run_steps([member.step], interval=0.2, until_idle=until_idle)
    finally:
        member.close()
    return member


def run_all(config: Config, options: PipelineOptions, store: Store, *, once: bool, until_idle: float | None,
            say: Say, on_incident: Callable[[Incident], None] | None = None,
            metrics: Metrics | None = None, alerter: Alerter | None = None) -> tuple[Collector, DetectorMember, SinkMember]:
    """``ckptwatch run --kafka``: the three services in one process, linked by the broker.
    With ``once``: publish the files' contents, then run detector and sink until idle for
    ``until_idle`` seconds (default 5), conclude (the input is complete, as in the embedded
    ``run --once``), drain the sink and deliver the alerts (at most 30 s)."""
    metrics = metrics or Metrics()
    if once:
        config = for_once(config)
    collector: Collector | None = None
    member: DetectorMember | None = None
    try:
        collector = _collector(config, options, say, metrics)
        # one process reads the files: their job-less lines are named as ``run`` names them
        member = _detector(config, options, say, metrics, base=options.detector_for(config.collect.paths))
        sinker = SinkMember(config, store, on_message=say, on_incident=on_incident, metrics=metrics,
                            alerter=alerter)
    except BaseException:  # no broker, or interrupted while waiting for one: close what was opened
        for service in (member, collector):
            if service is not None:
                service.close()
        if alerter:
            alerter.close()
        raise
    try:
        if once:
            collector.step(final=True)
            while collector.watcher.backlog:  # every byte: a chunk of each file per step
                collector.step(final=True)
            run_steps([member.step, sinker.step], interval=0.2, until_idle=until_idle or 5.0)
            member.step(final=True)  # every event is in: conclude what waited for late evidence, as run --once does
            run_steps([sinker.step], interval=0.2, until_idle=until_idle or 5.0)
            if alerter:
                alerter.drain(30.0)
        else:
            run_steps([collector.step, member.step, sinker.step], interval=config.collect.interval,
                      until_idle=until_idle)
    finally:
        collector.close()
        member.close()
        sinker.close()
    return collector, member, sinker
