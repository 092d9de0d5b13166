"""Prometheus metrics of a ckptwatch process and the HTTP ``/metrics`` endpoint serving them.

Each :class:`Metrics` owns its own :class:`prometheus_client.CollectorRegistry` (never the
library's global default registry), so many can live in one process (tests, ``run
--kafka``). The stages update it once per cycle or step from the main thread; alert
delivery may call the ``alert_*`` methods from its own thread (prometheus-client metrics
are thread-safe). Counters start at 0 when the process starts.

Metrics (every label has a small, fixed set of values; job ids only when configured):

``ckptwatch_lines_ingested_total{source_kind}``
    Log lines read, by the kind of file they came from: ``console`` (torchrun console),
    ``worker`` (one rank's output), ``kernel``, ``log`` (anything else). Counted when read,
    so it may run ahead of the records a line becomes part of. Embedded run and collectors.
``ckptwatch_events_total{source_kind,kind}``
    Events the rules produced from those lines; ``kind`` is an event kind of
    :data:`ckptwatch.schema.EVENT_KINDS` (``save_start``, ``oom_kill``, ...). Embedded run
    and collectors.
``ckptwatch_records_skipped_total{reason}``
    Input not turned into events, by ``reason``: ``no_rule_matched`` (records), ``line_too_long``
    (lines over 1 MiB), ``unreadable_file`` (files), ``bad_message`` (Kafka messages a
    detector or sink could not decode), ``offsets_lost`` (offsets of the events topic a
    detector or sink never received: retention deleted them first). A message or an offset
    counts once per process: in ``run --kafka`` the detector and the sink both meet it, and
    a partition read again (a rebalance, a broker restart) meets it again.
``ckptwatch_incidents_total{kind,severity}`` (plus ``job`` with ``[metrics] job_label = true``)
    Incidents, counted once per incident id when first emitted: a later version of the
    same incident (more evidence, superseded) does not count again. The embedded run
    rebuilds its detector from the database on start and emits every known incident
    again, so after a restart it counts those once more (the counter restarted at 0 too:
    ``increase()`` over a restart may include them). The detector service counts only ids
    never published to the incidents topic, so its restarts and rebalances do not.
``ckptwatch_sources_shared_total``
    Log files the fleet sink found published by two collectors (each file once per pair of
    collectors): a deployment in which a copytruncate copy's lines can be stored twice
    (:mod:`ckptwatch.sinks.shared_sources`).
``ckptwatch_alerts_sent_total{channel,action}``
    Notifications a channel accepted; ``action`` such as ``trigger``, ``resolve``.
``ckptwatch_alerts_failed_total{channel,reason}``
    Notifications given up on; ``reason`` such as ``rejected`` or ``expired``.
``ckptwatch_alerts_silenced_total{channel}``
    Notifications a silence muted (one per channel and incident).
``ckptwatch_alert_retries_total{channel}``
    Delivery attempts retried after a transient failure.
``ckptwatch_alerts_pending{channel}`` (gauge)
    Notifications queued and not delivered yet.
``ckptwatch_detector_lag_seconds`` (gauge, seconds)
    Wall clock minus the detector's watermark (see
    :meth:`ckptwatch.detectors.Detector.watermark`): about the allowed lateness when logs
    arrive as they are written; the age of the logs when old logs are read; NaN before the
    first event. A detector service with several partitions reports its most behind one.
``ckptwatch_open_saves`` (gauge)
    Saves started and not concluded (no end, no incident other than ``stalled_save``), over
    every job this process tracks (:meth:`ckptwatch.detectors.Detector.open_saves`).
``ckptwatch_kafka_consumer_lag_records{group,topic}`` (gauge, records)
    Fleet mode: records of ``topic`` waiting for this member of consumer ``group``, summed
    over its assigned partitions (end offset minus position, as of the last fetch). The
    detector and sink services.

Serving: :class:`MetricsServer` (``prometheus_client.start_http_server`` on its own thread).
In the configuration, ``[metrics] port = 0`` (the default) means no endpoint; through the
Python API port 0 asks the OS for a free port, read back from :attr:`MetricsServer.port`.
"""

from __future__ import annotations

import datetime as dt
import math
import bisect
import itertools
from collections.abc import Iterable, Mapping

import polars as pl
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server

from ckptwatch.detectors import Detector, Incident
from ckptwatch.ingest.stats import Stats

#: Values of the ``source_kind`` column (:data:`ckptwatch.schema.RECORD_SCHEMA`); the lines
#: counter starts each at 0 so that rates exist before the first line of a kind.
SOURCE_KINDS = ("console", "worker", "kernel", "log")
#: bad messages remembered to count each once (:meth:`Metrics.count_bad_message`): the two
#: stages of ``run --kafka`` meet one within a poll or two of each other
BAD_SEEN = 16_384
#: ranges of lost offsets remembered per partition (:meth:`Metrics.count_offsets_lost`)
LOST_RANGES = 1_024


class Metrics:
    """The metrics of one process, in :attr:`registry`. ``job_label``: add the job id as a
    label of ``ckptwatch_incidents_total`` (off by default: job ids are unbounded)."""

    def __init__(self, *, job_label: bool = False) -> None:
        self.registry = CollectorRegistry()
        self.job_label = job_label
        r = self.registry
        self.lines = Counter("ckptwatch_lines_ingested", "Log lines read, by source kind.", ["source_kind"],
                             registry=r)
        self.events = Counter("ckptwatch_events", "Events produced by the rules, by source kind and event kind.",
                              ["source_kind", "kind"], registry=r)
        self.skipped = Counter("ckptwatch_records_skipped", "Input not turned into events, by reason.", ["reason"],
                               registry=r)
        self.incidents = Counter("ckptwatch_incidents", "Incidents, counted once per id when first emitted.",
                                 ["kind", "severity", "job"] if job_label else ["kind", "severity"], registry=r)
        self.sources_shared = Counter("ckptwatch_sources_shared",
                                      "Log files found followed by more than one collector (fleet sink).", registry=r)
        self.alerts_sent = Counter("ckptwatch_alerts_sent", "Notifications accepted, by channel and action.",
                                   ["channel", "action"], registry=r)
        self.alerts_failed = Counter("ckptwatch_alerts_failed", "Notifications given up on, by channel and reason.",
                                     ["channel", "reason"], registry=r)
        self.alerts_silenced = Counter("ckptwatch_alerts_silenced", "Notifications muted by a silence, by channel.",
                                       ["channel"], registry=r)
        self.alert_retries = Counter("ckptwatch_alert_retries", "Notification deliveries retried, by channel.",
                                     ["channel"], registry=r)
        self.alerts_pending = Gauge("ckptwatch_alerts_pending", "Notifications queued, not delivered yet.",
                                    ["channel"], registry=r)
        self.detector_lag = Gauge("ckptwatch_detector_lag_seconds",
                                  "Wall clock minus the detector watermark, in seconds (NaN before any event).",
                                  registry=r)
        self.open_saves = Gauge("ckptwatch_open_saves", "Saves started and not concluded yet.", registry=r)
        self.consumer_lag = Gauge("ckptwatch_kafka_consumer_lag_records",
                                  "Records waiting for this consumer group member, by group and topic.",
                                  ["group", "topic"], registry=r)
        for kind in SOURCE_KINDS:
            self.lines.labels(kind)
        self.detector_lag.set(math.nan)
        self._seen: dict[tuple[str, str], int] = {}  # (counter, label) -> cumulative value counted so far
        self._incident_ids: set[str] = set()
        self._bad_seen: dict[tuple[str, int, int], None] = {}  # (topic, partition, offset), oldest first
        self._lost: dict[tuple[str, int], list[tuple[int, int]]] = {}  # (topic, partition) -> [first, end) ranges

    # -- ingest ------------------------------------------------------------------------------
    def _delta(self, counter: Counter, family: str, cumulative: Mapping[str, int]) -> None:
        for label, total in cumulative.items():
            before = self._seen.get((family, label), 0)
            if total > before:
                counter.labels(label).inc(total - before)
                self._seen[(family, label)] = total

    def observe_ingest(self, stats: Stats, events: pl.DataFrame | None = None) -> None:
        """After a poll: lines per source kind and skipped input from ``stats`` (cumulative
        counters of one watcher; only their growth since the last call is added), and the
        events of this batch (a DataFrame with ``source_kind`` and ``kind`` columns, the
        output of :func:`ckptwatch.pipeline.extract_events`; None or empty: none)."""
        self._delta(self.lines, "lines", stats.lines_by_kind)
        self._delta(self.skipped, "skipped", stats.skipped)
        if events is None or events.is_empty():
            return
        counts = events.group_by("source_kind", "kind").len()
        for source_kind, kind, n in counts.iter_rows():
            self.events.labels(source_kind or "log", kind).inc(n)

    def count_skipped(self, reason: str, n: int = 1) -> None:
        """Count ``n`` records skipped for ``reason``. Kafka messages and offsets go through
        :meth:`count_bad_message` and :meth:`count_offsets_lost`, which count each once."""
        self.skipped.labels(reason).inc(n)

    def count_bad_message(self, topic: str, partition: int, offset: int) -> bool:
        """Count the message at ``offset`` of ``topic`` partition ``partition`` as skipped
        (``reason="bad_message"``) unless this object counted it already: the detector and
        the sink of ``run --kafka`` both skip it, a partition read again meets it again.
        Returns True if it was counted now. The newest :data:`BAD_SEEN` messages counted are
        remembered (a flood of bad messages costs that much memory, no more)."""
        key = (topic, partition, offset)
        if key in self._bad_seen:
            return False
        self._bad_seen[key] = None
        if len(self._bad_seen) > BAD_SEEN:
            for old in list(itertools.islice(self._bad_seen, BAD_SEEN // 2)):
                del self._bad_seen[old]
        self.skipped.labels("bad_message").inc()
        return True

    def count_offsets_lost(self, topic: str, partition: int, first: int, end: int) -> int:
        """Count offsets ``first`` .. ``end - 1`` of ``topic`` partition ``partition`` as never
        received (``reason="offsets_lost"``), each once: those this object counted already
        (the other stage of ``run --kafka`` found the same gap, or one overlapping it) are
        left out. Returns how many were counted now. Up to :data:`LOST_RANGES` disjoint
        ranges are remembered per partition (past that, the lowest are forgotten)."""
        if end <= first:
            return 0
        ranges = self._lost.setdefault((topic, partition), [])
        i = bisect.bisect_left(ranges, first, key=lambda r: r[1])  # the first range ending at or after first
        j, known = i, 0
        while j < len(ranges) and ranges[j][0] <= end:  # overlapping or touching [first, end)
            known += max(0, min(end, ranges[j][1]) - max(first, ranges[j][0]))
            j += 1
        merged = (min(first, ranges[i][0]), max(end, ranges[j - 1][1])) if j > i else (first, end)
        ranges[i:j] = [merged]
        del ranges[:-LOST_RANGES]
        new = end - first - known
        if new:
            self.skipped.labels("offsets_lost").inc(new)
        return new

    # -- detection ---------------------------------------------------------------------------
    def observe_incidents(self, incidents: Iterable[Incident]) -> int:
        """Count the incidents whose id this object has not counted yet; returns how many."""
        n = 0
        for inc in incidents:
            if inc.id in self._incident_ids:
                continue
            self._incident_ids.add(inc.id)
            labels = [inc.kind, inc.severity] + ([inc.job or "unknown"] if self.job_label else [])
            self.incidents.labels(*labels).inc()
            n += 1
        return n

    def observe_detectors(self, detectors: Iterable[Detector], now: dt.datetime | None = None) -> None:
        """Detector lag (seconds; the most behind of ``detectors``, NaN when none has seen an
        event) at wall time ``now`` (UTC; default: the clock), and open saves (summed over
        ``detectors``, as of their last advance)."""
        now = now or dt.datetime.now(dt.timezone.utc)
        detectors = list(detectors)
        lag = math.nan
        for det in detectors:
            wm = det.watermark(now)
            if wm is not None:
                behind = (now - wm).total_seconds()
                lag = behind if math.isnan(lag) else max(lag, behind)
        self.detector_lag.set(lag)
        self.open_saves.set(sum(det.open_saves() for det in detectors))

    def set_consumer_lag(self, group: str, lag: Mapping[str, int]) -> None:
        """Records waiting per topic for a member of consumer ``group`` (see
        :meth:`ckptwatch.kafka.consumer.GroupMember.lag`)."""
        for topic, n in lag.items():
            self.consumer_lag.labels(group, topic).set(n)

    # -- alerts ------------------------------------------------------------------------------
    def declare_channel(self, channel: str) -> None:
        """Create ``channel``'s failure, retry and pending series at 0, so alert rules see
        them before the first failure."""
        for reason in ("rejected", "expired"):
            self.alerts_failed.labels(channel, reason)
        self.alert_retries.labels(channel)
        self.alerts_silenced.labels(channel)
        self.alerts_pending.labels(channel).set(0)

    def alert_sent(self, channel: str, action: str) -> None:
        """One notification accepted by ``channel``; ``action`` such as ``trigger``, ``resolve``."""
        self.alerts_sent.labels(channel, action).inc()

    def alert_silenced(self, channel: str) -> None:
        """One notification to ``channel`` muted by a silence."""
        self.alerts_silenced.labels(channel).inc()

    def alert_failed(self, channel: str, reason: str) -> None:
        """One notification given up on; ``reason`` such as ``rejected`` or ``expired``."""
        self.alerts_failed.labels(channel, reason).inc()

    def alert_retried(self, channel: str) -> None:
        """One delivery to ``channel`` retried after a transient failure."""
        self.alert_retries.labels(channel).inc()

    def set_alerts_pending(self, channel: str, n: int) -> None:
        """``n`` notifications queued for ``channel``, not delivered yet."""
        self.alerts_pending.labels(channel).set(n)

    def exposition(self) -> str:
        """The registry in the Prometheus text format, as ``/metrics`` serves it."""
        return generate_latest(self.registry).decode()


class MetricsServer:
    """Serves ``metrics`` at ``http://address:port/metrics`` on a daemon thread until
    :meth:`close`. ``port`` 0: a free port chosen by the OS (see :attr:`port`).

    Raises OSError when the address cannot be bound (``errno.EADDRINUSE``: port in use)."""

    def __init__(self, metrics: Metrics, port: int = 0, address: str = "127.0.0.1") -> None:
        self.metrics = metrics
        self.address = address
        self._server, self._thread = start_http_server(port, addr=address, registry=metrics.registry)
        self._closed = False

    @property
    def port(self) -> int:
        """The TCP port bound."""
        return int(self._server.server_port)

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port (again: nothing)."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
