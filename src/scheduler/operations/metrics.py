"""``GET /metrics``: Prometheus metrics of this process and of the table, with prometheus_client.

Counters and histograms are fed by a ``Scheduler.poll_hooks`` hook from the poll's report
(``EventOutcome.event_type`` and ``.lateness``), so they count this process's work only. Gauges that
need the database are computed at scrape time from the partial indexes (backlog, oldest overdue,
failed rows: exact up to ``counts.COUNT_CAP`` of them, the planner's estimate past it, so a scrape's
cost stays bounded at any size) and cached for ``cache_seconds`` of the injected clock, so a scraper
polling every second costs one set of index-only reads per window. Labels never carry participant
ids; ``event_type`` is capped at ``MAX_EVENT_TYPES`` values (then ``other``), since senders choose
it. The event types known in advance (the catalogue's scenarios) start at zero, so a healthy
service's failure panels show 0, not "No data"; they do not count against the cap.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.exc import DBAPIError

from scheduler.application.counts import counted_or_estimated
from scheduler.core.clock import clock_details
from scheduler.core.loop import PollReport, Scheduler
from scheduler.database.database import Database
from scheduler.delivery.record import DeliveryStatus
from scheduler.operations.delivery_worker import Recorded
from scheduler.operations.heartbeat import replica_rows
from scheduler.types import Clock, EventStatus

MAX_EVENT_TYPES = 100
POLL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Lateness is measured against poll intervals of seconds to minutes and backlogs of hours.
LATENESS_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)
DELIVERY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0, 21600.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REPLICA_STATES = ("ok", "failing", "stale")


def database_gauges(database: Database, now: datetime) -> dict[str, float]:
    """Backlog (due pending rows), the oldest overdue row's age in seconds, failed rows,
    and replicas by state: the heartbeats ``/admin/replicas`` lists, judged by the same
    ``replica_state`` (OBS-7)."""
    with database.begin() as session:
        backlog = database.operations.backlog(session, now)
        failed, _ = counted_or_estimated(session, database.events, EventStatus.FAILED)
        replicas = Tally(str(row["state"]) for row in replica_rows(session, database, now))
        outbox = database.deliveries.gauges(session, now)
    oldest = backlog["oldest_trigger_at"]
    return {
        "deliveries_queued": float(outbox["queued"]),
        "deliveries_retrying": float(outbox["retrying"]),
        "oldest_queued_delivery_seconds": max(float(outbox["oldest_seconds"] or 0.0), 0.0),
        **{f"replicas_{state}": float(replicas[state]) for state in REPLICA_STATES},
        "backlog": float(backlog["backlog"]),
        "oldest_overdue_seconds": max((now - oldest).total_seconds(), 0.0) if oldest else 0.0,
        "failed": float(failed),
    }


class _DatabaseGauges(Collector):
    """Gauges computed at scrape time, cached for a few seconds of the injected clock."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._cached: tuple[datetime, dict[str, float]] | None = None
        self._lock = threading.Lock()

    def _values(self) -> dict[str, float] | None:
        now = self.metrics.clock.now()
        with self._lock:
            if self._cached and now - self._cached[0] < self.metrics.cache_for and now >= self._cached[0]:
                return self._cached[1]
            try:
                values = database_gauges(self.metrics.database, now)
            except DBAPIError:
                return None
            self._cached = (now, values)
            return values

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily("scheduler_loop_running", "1 while this process's polling loop task runs")
        running.add_metric([], 1.0 if self.metrics.loop_alive() else 0.0)
        yield running
        offset = clock_details(self.metrics.clock)["offset_seconds"]
        if isinstance(offset, float):
            # Only production's clock measures one (DEC-10); an injected clock has none.
            gauge = GaugeMetricFamily("scheduler_clock_offset_seconds",
                                      "the database's clock minus this host's, as last measured; "
                                      "the scheduler uses the database's")
            gauge.add_metric([], offset)
            yield gauge
        values = self._values()
        up = GaugeMetricFamily("scheduler_database_up", "1 when the scrape-time queries succeeded")
        up.add_metric([], 0.0 if values is None else 1.0)
        yield up
        if values is None:
            return
        for name, key, doc in (
            ("scheduler_backlog_events", "backlog", "pending rows whose trigger_at has passed"),
            ("scheduler_oldest_overdue_seconds", "oldest_overdue_seconds",
             "age of the oldest due pending row (0 when none)"),
            ("scheduler_failed_events", "failed", "rows in status failed (past 100,000, the planner's estimate)"),
            ("scheduler_oldest_queued_delivery_seconds", "oldest_queued_delivery_seconds",
             "age of the oldest outbox row not yet delivered or given up (0 when none)"),
        ):
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], values[key])
            yield gauge
        depth = GaugeMetricFamily("scheduler_deliveries_queued", "outbox rows waiting to be sent, by status",
                                  labels=["status"])
        for status in ("queued", "retrying"):
            depth.add_metric([status], values[f"deliveries_{status}"])
        yield depth
        replicas = GaugeMetricFamily("scheduler_replicas", "replicas by the state of their heartbeats "
                                     "(stale: silent for three poll intervals)", labels=["state"])
        for state in REPLICA_STATES:
            replicas.add_metric([state], values[f"replicas_{state}"])
        yield replicas


class Metrics:
    """This process's metrics registry, a poll hook that feeds it, and the scrape."""

    def __init__(
        self,
        database: Database,
        clock: Clock,
        loop_alive: Callable[[], bool],
        *,
        cache_seconds: float = 5.0,
        registry: CollectorRegistry | None = None,
        event_types: Iterable[str] = (),
    ) -> None:
        self.database = database
        self.clock = clock
        self.loop_alive = loop_alive
        self.cache_for = timedelta(seconds=cache_seconds)
        # A host's registry (its /metrics then shows ours), else one of this service's own.
        self.registry = registry if registry is not None else CollectorRegistry()
        self.dispatched = Counter("scheduler_events_dispatched", "events this process dispatched",
                                  ["event_type"], registry=self.registry)
        self.failed = Counter("scheduler_events_failed", "events this process marked failed",
                              ["event_type"], registry=self.registry)
        self.expired = Counter("scheduler_events_expired",
                               "events this process's claims ended expired (claimed after their expires_at)",
                               ["event_type"], registry=self.registry)
        self.polls = Counter("scheduler_polls", "polls this process ran, completed or failed",
                             registry=self.registry)
        self.poll_errors = Counter("scheduler_poll_errors", "polls that failed as a whole (REQ-0067)",
                                   registry=self.registry)
        self.poll_duration = Histogram("scheduler_poll_duration_seconds", "wall time of one poll",
                                       buckets=POLL_BUCKETS, registry=self.registry)
        self.lateness = Histogram("scheduler_event_lateness_seconds",
                                  "dispatched_at - trigger_at of each dispatched event",
                                  buckets=LATENESS_BUCKETS, registry=self.registry)
        self.delivery_attempts = Counter("scheduler_delivery_attempts",
                                         "outbox attempts this process recorded, by channel and outcome "
                                         "(delivered, retrying, undeliverable)", ["channel", "outcome"],
                                         registry=self.registry)
        self.delivery_latency = Histogram("scheduler_delivery_latency_seconds",
                                          "trigger_at (a live event: its notification's time) to delivered, "
                                          "per outbox delivery", buckets=DELIVERY_BUCKETS, registry=self.registry)
        self.registry.register(_DatabaseGauges(self))
        self._seen_report: PollReport | None = None
        self._event_types: set[str] = set()
        self._known = frozenset(list(dict.fromkeys(event_types))[:MAX_EVENT_TYPES])
        for known in self._known:  # a series exists from the first scrape, at zero
            self.dispatched.labels(known)
            self.failed.labels(known)
            self.expired.labels(known)

    def _label(self, event_type: str) -> str:
        if event_type in self._known or event_type in self._event_types:
            return event_type
        if len(self._event_types) >= MAX_EVENT_TYPES:
            return "other"
        self._event_types.add(event_type)
        return event_type

    def __call__(self, scheduler: Scheduler) -> None:
        """The poll hook: one poll more; its outcomes if it committed, else one error."""
        self.polls.inc()
        seconds = scheduler.last_poll_seconds
        if seconds is not None:
            self.poll_duration.observe(seconds)
        report = scheduler.last_report
        if report is None or report is self._seen_report:
            self.poll_errors.inc()
            return
        self._seen_report = report
        for outcome in report.outcomes:
            label = self._label(outcome.event_type or "unknown")
            if outcome.status == EventStatus.DISPATCHED:
                self.dispatched.labels(label).inc()
                lateness = outcome.lateness
                if lateness is not None:
                    self.lateness.observe(max(lateness.total_seconds(), 0.0))
            elif outcome.status == EventStatus.FAILED:
                self.failed.labels(label).inc()
            # a row held in quiet hours (pending, QUIET-2) is neither: it is decided again later
        for ended in report.expired:  # never dispatched: no lateness observed (EXP-7)
            self.expired.labels(self._label(ended.event_type or "unknown")).inc()

    def deliveries(self, recorded: list[Recorded]) -> None:
        """The delivery worker's observer: each attempt it recorded, by channel and outcome, and
        each delivery's trigger-to-delivered latency."""
        for one in recorded:
            if not one.kept:
                continue
            self.delivery_attempts.labels(one.claimed.delivery.channel, str(one.record.status)).inc()
            if one.record.status == DeliveryStatus.DELIVERED:
                self.delivery_latency.observe(max((one.at - one.claimed.triggered_at).total_seconds(), 0.0))

    def exposition(self) -> bytes:
        """The Prometheus text format (runs the scrape-time queries: call off the event loop)."""
        return generate_latest(self.registry)


def parse_exposition(text: str) -> dict[str, Any]:
    """Samples of an exposition by name and labels (for tests and the console)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())) + "}"
                                 if sample.labels else "")
            samples[key] = sample.value
    return samples
