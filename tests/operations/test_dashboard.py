"""The Grafana dashboard (docs/grafana-dashboard.json) reads only metrics the service exposes.

In our words: every PromQL expression of the dashboard names metrics (and groups by labels)
that a real scrape of ``GET /metrics`` shows, so renaming a metric breaks this test before
it breaks an operator's dashboard; and the dashboard shows what OBS and DASH clauses list.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.service import SchedulerService
from tests.conftest import T0, TEST_SECRET
from tests.helpers import post_event
from tests.operations.support import loop_step
from tests.requirements.test_outbox import ScriptedSender, worker

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
BAD_FACTS = {"facts_version": "1", "scenario": "commitment_reminder", "date": "someday"}
# Labels Prometheus adds to every scraped series (the target's), not the service.
TARGET_LABELS = {"job", "instance"}
# PromQL's aggregation operators and keywords: words that are never metric names.
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
    "group", "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
    "offset",
}
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
LABEL_VALUES = re.compile(r"^label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*(\w+)\s*\)$")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (not its functions, labels or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range selectors
    text = GROUPING.sub(" ", text)  # by (...), on (...): label lists
    text = re.sub(r"\$\{[^}]*\}|\$\w+", " ", text)  # Grafana variables
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*", text):
        word = match.group()
        if word in PROMQL_WORDS or text[match.end():].lstrip().startswith("("):
            continue  # an operator, or a function's name
        names.add(word)
    return names


def grouping_labels(expr: str) -> set[str]:
    return {label.strip() for group in GROUPING.findall(expr) for label in group.split(",") if label.strip()}


def expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target, nested rows included, and every query variable."""
    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            found = LABEL_VALUES.match(query)
            assert found, f"variable {variable['name']}: unsupported query {query!r}"
            yield f"variable {variable['name']!r}", found[1]


def exposed(exposition: str) -> dict[str, set[str]]:
    """Sample names of an exposition, each with the label names its samples carry."""
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


def problems(dashboard: dict[str, Any], samples: dict[str, set[str]]) -> list[str]:
    """What of the dashboard the exposition does not back: unknown metrics, unknown labels."""
    found = []
    for where, expr in expressions(dashboard):
        names = metric_names(expr)
        if not names:
            found.append(f"{where}: reads no metric: {expr}")
        for name in sorted(names - samples.keys()):
            found.append(f"{where}: metric {name} is not exposed")
        known = set(TARGET_LABELS).union(*(samples.get(n, set()) for n in names))
        for label in sorted(grouping_labels(expr) - known):
            found.append(f"{where}: label {label} is on none of {sorted(names)}")
    return found


@pytest.fixture
def service(settings: Settings, engine: Engine, clock: ManualClock, publisher: RecordingPublisher) -> SchedulerService:
    """The suite's service with an outbox channel (a fake provider at the edge), so the
    delivery metrics have series too."""
    return SchedulerService(settings, engine=engine, clock=clock, publisher=publisher, run_scheduler=False,
                            senders={"sms": ScriptedSender()})


@pytest.fixture
def exposition(service: SchedulerService, client: TestClient, clock: ManualClock) -> str:
    """A real scrape after a poll that dispatched one event and failed one, and the delivery
    worker's attempt at the dispatched one's outbox row, so that every labelled series exists."""
    post_event(client, user_id="anna", trigger_at=T0)
    post_event(client, user_id="carl", trigger_at=T0, facts=BAD_FACTS)
    clock.advance(timedelta(seconds=30))
    loop_step(service)
    sending = worker(service, ScriptedSender(), clock)
    sending.observers.append(service.metrics.deliveries)
    assert len(asyncio.run(sending.run_once())) == 1
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    text: str = response.text
    return text


@pytest.fixture
def production_exposition(engine: Engine) -> str:
    """A real scrape of a service on production's clock (the database's, DEC-10), which alone
    exports the measured clock offset."""
    service = SchedulerService(Settings(jwt_secret=TEST_SECRET), engine=engine, run_scheduler=False)
    with TestClient(service.app) as client:  # the lifespan takes the clock's first reading
        response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert "scheduler_clock_offset_seconds" in response.text
    text: str = response.text
    return text


@pytest.mark.clause("DASH-1")
@pytest.mark.clause("DASH-3")
def test_every_expression_of_the_dashboard_reads_metrics_and_labels_the_service_exposes(
    exposition: str, production_exposition: str
) -> None:
    """DASH-1: each PromQL expression (panels and variables) names at least one metric, only
    metrics a real scrape shows (on an injected clock, and on production's for the clock
    offset), and groups only by labels those metrics (or the target) carry."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert problems(dashboard, exposed(exposition + production_exposition)) == []


@pytest.mark.clause("DASH-1")
def test_a_renamed_metric_is_reported_with_the_panels_that_read_it(exposition: str, production_exposition: str) -> None:
    """DASH-1: the check has teeth: the same scrape with one metric renamed (as a refactoring
    would) makes every panel reading the old name a problem."""
    dashboard = json.loads(DASHBOARD.read_text())
    renamed = (exposition + production_exposition).replace("scheduler_backlog_events", "scheduler_due_rows")
    found = problems(dashboard, exposed(renamed))
    assert found and all("scheduler_backlog_events is not exposed" in p for p in found)
    assert any("Backlog (due, pending)" in p for p in found)
    relabelled = exposition.replace('event_type="', 'type="')
    assert any("label event_type" in p for p in problems(dashboard, exposed(relabelled)))


@pytest.mark.clause("DASH-1")
def test_the_expression_reader_finds_metrics_and_skips_functions_labels_and_variables() -> None:
    """DASH-1: the reader the check relies on."""
    expr = ('histogram_quantile(0.99, sum by (le, instance) (rate(a_bucket{job=~"$job", x="sum(b)"}'
            '[$__rate_interval]))) / on (instance) group_left c_total offset 5m')
    assert metric_names(expr) == {"a_bucket", "c_total"}
    assert grouping_labels(expr) == {"le", "instance"}


@pytest.mark.clause("DASH-2")
def test_the_dashboard_shows_what_an_operator_starts_from() -> None:
    """DASH-2: dispatch and failure rates, lateness p50 and p99, backlog and oldest overdue,
    failed rows, replicas by state, poll errors, the database's reachability and each host's
    clock offset from the database; panels have
    unique ids and all read the dashboard's Prometheus data source variable."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [expr for _, expr in expressions(dashboard)]

    def reads(metric: str, *also: str) -> bool:
        return any(metric in metric_names(e) and all(part in e for part in also) for e in exprs)

    assert reads("scheduler_events_dispatched_total", "rate(")
    assert reads("scheduler_events_failed_total", "rate(")
    assert reads("scheduler_event_lateness_seconds_bucket", "histogram_quantile(0.5,")
    assert reads("scheduler_event_lateness_seconds_bucket", "histogram_quantile(0.99,")
    assert reads("scheduler_backlog_events")
    assert reads("scheduler_oldest_overdue_seconds")
    assert reads("scheduler_failed_events")
    assert reads("scheduler_replicas", "by (state)")
    assert reads("scheduler_poll_errors_total")
    assert reads("scheduler_database_up")
    assert reads("scheduler_clock_offset_seconds")
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    assert all(p["datasource"] == {"type": "prometheus", "uid": "${datasource}"} for p in panels)
    assert dashboard["uid"] and dashboard["schemaVersion"] >= 36


@pytest.mark.clause("DASH-3")
def test_the_dashboard_shows_delivery_outcomes_outbox_depth_oldest_queued_and_trigger_to_delivered() -> None:
    """DASH-3: the delivery row's panels: attempts by channel and outcome as a rate, the outbox's
    depth by status, the oldest queued delivery's age, and trigger-to-delivered p50 and p99 (each
    metric exposed, DASH-1's check)."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [expr for _, expr in expressions(dashboard)]

    def reads(metric: str, *also: str) -> bool:
        return any(metric in metric_names(e) and all(part in e for part in also) for e in exprs)

    assert reads("scheduler_delivery_attempts_total", "rate(", "by (channel, outcome)")
    assert reads("scheduler_deliveries_queued", "by (status)")
    assert reads("scheduler_oldest_queued_delivery_seconds")
    assert reads("scheduler_delivery_latency_seconds_bucket", "histogram_quantile(0.5,")
    assert reads("scheduler_delivery_latency_seconds_bucket", "histogram_quantile(0.99,")
    titles = [p["title"] for p in dashboard["panels"]]
    assert "Delivery (outbox)" in titles and "Delivery outcomes by channel" in titles
