"""OpenTelemetry traces from the request that stores a row to the dispatch that sends it.

In our words: with tracing on, every request, statement, poll and dispatch is a span; the
row keeps the storing request's trace context and its dispatch span links to it; no span
attribute ever names a participant or a community; with tracing off, OpenTelemetry is not
even imported. The spans are read back with the SDK's in-memory exporter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.config import ConfigError, Settings
from scheduler.core.clock import ManualClock
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.observability.observer import normalized_traceparent, parse_traceparent
from scheduler.observability.otel import TracingObserver
from scheduler.observability.tracing import traces_exporters
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, INGEST, T0, TEST_SECRET
from tests.helpers import event_body, event_row, reminder_facts
from tests.operations.support import loop_step

ROOT = Path(__file__).resolve().parents[2]
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
CALLER_TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
# Identifiers that must never appear in a span: distinctive, so a substring search is exact.
PARTICIPANT = "participant-otel-4711"
COMMUNITY = "community-otel-0815"
SUBPROCESS_DEADLINE = 120


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def traced(settings: Settings, engine: Engine, clock: ManualClock, publisher: RecordingPublisher,
           spans: InMemorySpanExporter) -> SchedulerService:
    """The service with a tracing observer whose spans land in ``spans``."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return SchedulerService(settings, engine=engine, clock=clock, publisher=publisher, run_scheduler=False,
                            observer=TracingObserver(provider))


@pytest.fixture
def traced_client(traced: SchedulerService) -> Iterator[TestClient]:
    with TestClient(traced.app, raise_server_exceptions=True) as client:
        yield client


def live_body(**kwargs: Any) -> dict[str, Any]:
    """A live event (``POST /admin/ingest-event``): a scheduled body without its trigger time."""
    body = event_body(**kwargs)
    del body["trigger_at"]
    return body


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


def one(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = named(spans, name)
    assert len(found) == 1, f"{len(found)} spans named {name!r}: {[s.name for s in spans.get_finished_spans()]}"
    return found[0]


def every_recorded_value(span: ReadableSpan) -> Iterator[str]:
    """Everything a span carries that an exporter sends: name, attributes, events, links, status."""
    yield span.name
    yield str(span.status.description or "")
    for attributes in [span.attributes or {}, *[(e.attributes or {}) for e in span.events],
                       *[(link.attributes or {}) for link in span.links]]:
        for key, value in attributes.items():
            yield f"{key}={value!s}" if not isinstance(value, bytes) else f"{key}={value.decode(errors='replace')}"


@pytest.mark.clause("TRACE-1")
@pytest.mark.clause("DEC-OBS-2")
def test_a_dispatch_span_links_to_the_span_of_the_post_that_stored_the_event(
    traced: SchedulerService, traced_client: TestClient, clock: ManualClock, engine: Engine,
    spans: InMemorySpanExporter,
) -> None:
    """TRACE-1: the POST joins the caller's trace; its row keeps the POST's span; the dispatch
    (a child of its poll) links to it and says event id, type, outcome and lateness."""
    response = traced_client.post("/admin/scheduled-events", json=event_body(trigger_at=T0),
                                  headers={**INGEST, "traceparent": CALLER_TRACEPARENT})
    assert response.status_code == 201, response.text
    event_id = response.json()["id"]
    post = one(spans, "POST /admin/scheduled-events")
    assert post.kind is SpanKind.SERVER
    assert post.context is not None and post.parent is not None
    assert f"{post.context.trace_id:032x}" == CALLER_TRACE  # the caller's trace continues
    assert f"{post.parent.span_id:016x}" == CALLER_SPAN
    stored = event_row(engine, event_id)["traceparent"]
    assert stored == f"00-{CALLER_TRACE}-{post.context.span_id:016x}-01"
    # the store's INSERT is a span of the POST's trace
    assert any(s.name.startswith("INSERT") and s.context is not None and s.context.trace_id == post.context.trace_id
               for s in spans.get_finished_spans())

    clock.advance(timedelta(seconds=90))
    loop_step(traced)
    dispatch = one(spans, "scheduler.dispatch")
    poll = next(s for s in named(spans, "scheduler.poll") if (s.attributes or {}).get("scheduler.poll.claimed") == 1)
    assert dispatch.parent is not None and poll.context is not None
    assert dispatch.parent.span_id == poll.context.span_id  # a child of its poll, in the loop's own trace
    assert dispatch.context is not None and dispatch.context.trace_id != post.context.trace_id
    assert [(link.context.trace_id, link.context.span_id) for link in dispatch.links] == [
        (post.context.trace_id, post.context.span_id)
    ]
    assert dict(dispatch.attributes or {}) == {
        "scheduler.event.id": event_id,
        "scheduler.event.type": "commitment_reminder",
        "scheduler.event.outcome": "dispatched",
        "scheduler.event.lateness_seconds": 90.0,
    }
    assert (poll.attributes or {})["scheduler.poll.dispatched"] == 1
    # the dispatch's statements are its children, each named by its first word (the batch's
    # pipelined write goes with its COMMIT, DEC-1 "Round trips", and is traced as one too)
    statements = [s for s in spans.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert any(s.parent is not None and s.parent.span_id == dispatch.context.span_id for s in statements)
    assert {s.name.split()[0] for s in statements} <= {"SELECT", "INSERT", "UPDATE", "DELETE", "WITH",
                                                       "SAVEPOINT", "RELEASE", "ROLLBACK", "COMMIT"}


@pytest.mark.clause("TRACE-1")
@pytest.mark.clause("DEC-OBS-2")
def test_a_rewrite_by_external_key_links_the_dispatch_to_the_latest_storing_request(
    traced: SchedulerService, traced_client: TestClient, clock: ManualClock, spans: InMemorySpanExporter,
) -> None:
    """TRACE-1: a re-post of an external key replaces the stored trace context (the request
    that last wrote the row is the one that scheduled what fires)."""
    first = f"00-{'1' * 32}-{'2' * 16}-01"
    second = f"00-{'3' * 32}-{'4' * 16}-01"
    for header in (first, second):
        response = traced_client.post("/admin/scheduled-events", json=event_body(external_key="k-1", trigger_at=T0),
                                      headers={**INGEST, "traceparent": header})
        assert response.status_code == 201, response.text
    loop_step(traced)
    [link] = one(spans, "scheduler.dispatch").links
    assert f"{link.context.trace_id:032x}" == "3" * 32


@pytest.mark.clause("TRACE-2")
def test_no_span_attribute_names_a_participant_or_a_community(
    traced: SchedulerService, traced_client: TestClient, clock: ManualClock, spans: InMemorySpanExporter,
) -> None:
    """TRACE-2: a POST, a failing and a dispatched event, a live ingest, reads filtered by user
    and a path holding the user id: no span carries the participant's or community's id."""
    ids = {"user_id": PARTICIPANT, "community_id": COMMUNITY}
    for body in (event_body(trigger_at=T0, **ids),
                 event_body(trigger_at=T0, facts={"facts_version": "1", "scenario": "commitment_reminder"}, **ids)):
        response = traced_client.post("/admin/scheduled-events", json=body,
                                      headers={**INGEST, "traceparent": CALLER_TRACEPARENT})
        assert response.status_code in (201, 422), response.text
    stored = event_body(trigger_at=T0, facts=reminder_facts(day="2026-12-01"), **ids)
    traced_client.post("/admin/scheduled-events", json=stored, headers=INGEST).raise_for_status()
    assert traced_client.post("/admin/ingest-event", headers=INGEST,
                              json=live_body(facts=reminder_facts(day="2026-12-02"), **ids)).status_code == 200
    assert traced_client.get(f"/admin/scheduled-events?user_id={PARTICIPANT}", headers=ADMIN).status_code == 200
    assert traced_client.get(f"/admin/notifications?user_id={PARTICIPANT}", headers=ADMIN).status_code == 200
    assert traced_client.put(f"/admin/participants/{PARTICIPANT}/preferences", headers=ADMIN,
                             json={"max_per_day": 5}).status_code == 200
    clock.advance(timedelta(seconds=5))
    loop_step(traced)
    finished = spans.get_finished_spans()
    assert {"scheduler.dispatch", "scheduler.poll", "scheduler.ingest",
            "PUT /admin/participants/{user_id}/preferences"} <= {s.name for s in finished}
    leaks = [(s.name, value) for s in finished for value in every_recorded_value(s)
             if PARTICIPANT in value or COMMUNITY in value]
    assert leaks == []
    # the path was rewritten to its template, not dropped: the span still says which route
    put = one(spans, "PUT /admin/participants/{user_id}/preferences")
    assert "/admin/participants/{user_id}/preferences" in {str(v) for v in (put.attributes or {}).values()}


@pytest.mark.clause("TRACE-3")
def test_a_live_ingest_is_traced_from_its_request_through_its_dispatch(
    traced_client: TestClient, spans: InMemorySpanExporter,
) -> None:
    """TRACE-3: POST /admin/ingest-event: the request's span, a ``scheduler.ingest`` child with
    the event type and outcome, and the dispatch's statements under it."""
    response = traced_client.post("/admin/ingest-event", json=live_body(),
                                  headers={**INGEST, "traceparent": CALLER_TRACEPARENT})
    assert response.status_code == 200, response.text
    request = one(spans, "POST /admin/ingest-event")
    ingest = one(spans, "scheduler.ingest")
    assert request.context is not None and ingest.parent is not None and ingest.context is not None
    assert f"{request.context.trace_id:032x}" == CALLER_TRACE
    assert ingest.parent.span_id == request.context.span_id
    assert dict(ingest.attributes or {}) == {"scheduler.event.type": "commitment_reminder",
                                             "scheduler.event.outcome": "delivered"}
    assert any(s.parent is not None and s.parent.span_id == ingest.context.span_id and s.kind is SpanKind.CLIENT
               for s in spans.get_finished_spans())


@pytest.mark.clause("BATCH-6")
def test_a_batch_store_is_one_span_with_its_count_and_its_rows_link_to_the_request(
    traced_client: TestClient, spans: InMemorySpanExporter, engine: Engine,
) -> None:
    """BATCH-6: POST /admin/scheduled-events/bulk: one ``scheduler.store_bulk`` child of the
    request with the items counted (stored, refused), its statements under it, and every
    stored row keeping the request's trace context, as a single POST's row does."""
    items = [event_body(user_id=PARTICIPANT), event_body(external_key="k"), {"not": "an event"}]
    response = traced_client.post("/admin/scheduled-events/bulk", json=items,
                                  headers={**INGEST, "traceparent": CALLER_TRACEPARENT})
    assert response.status_code == 200, response.text
    request = one(spans, "POST /admin/scheduled-events/bulk")
    stored = one(spans, "scheduler.store_bulk")
    assert request.context is not None and stored.parent is not None and stored.context is not None
    assert stored.parent.span_id == request.context.span_id
    assert dict(stored.attributes or {}) == {"scheduler.bulk.count": 3, "scheduler.bulk.stored": 2,
                                             "scheduler.bulk.refused": 1}
    assert any(s.parent is not None and s.parent.span_id == stored.context.span_id and s.kind is SpanKind.CLIENT
               for s in spans.get_finished_spans())
    for result in response.json()[:2]:
        kept = parse_traceparent(event_row(engine, result["event"]["id"])["traceparent"])
        assert kept is not None and (kept.trace_id, kept.span_id) == (request.context.trace_id,
                                                                      request.context.span_id)


@pytest.mark.clause("TRACE-4")
def test_without_tracing_a_row_keeps_a_valid_caller_traceparent_and_ignores_an_invalid_one(
    client: TestClient, engine: Engine
) -> None:
    """TRACE-4: tracing off, the row keeps the caller's valid header (normalised), so a
    replica that traces can still link to it; an invalid header is ignored, never a 4xx."""
    def store(header: str) -> Any:
        response = client.post("/admin/scheduled-events", json=event_body(), headers={**INGEST, "traceparent": header})
        assert response.status_code == 201, response.text
        return event_row(engine, response.json()["id"])["traceparent"]

    assert store(f" {CALLER_TRACEPARENT}\t") == CALLER_TRACEPARENT
    assert store(CALLER_TRACEPARENT.upper()) is None
    assert store(f"00-{'0' * 32}-{CALLER_SPAN}-01") is None
    assert store("not a trace context") is None


@pytest.mark.clause("TRACE-4")
def test_the_traceparent_parser_follows_the_w3c_rules() -> None:
    """TRACE-4: version 00 is exactly four fields; a later version's extra fields are read
    past; version ff, zero ids, upper case, and overlong values are invalid."""
    assert normalized_traceparent(CALLER_TRACEPARENT) == CALLER_TRACEPARENT
    later = normalized_traceparent(f"01-{CALLER_TRACE}-{CALLER_SPAN}-00-later-field")
    assert later == f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"
    for invalid in (f"{CALLER_TRACEPARENT}-extra", f"ff-{CALLER_TRACE}-{CALLER_SPAN}-01",
                    f"00-{CALLER_TRACE}-{'0' * 16}-01", f"00-{CALLER_TRACE[:-1]}-{CALLER_SPAN}-01",
                    f"01-{CALLER_TRACE}-{CALLER_SPAN}-01x", f"01-{CALLER_TRACE}-{CALLER_SPAN}-01-" + "a" * 600,
                    "", None):
        assert normalized_traceparent(invalid) is None, invalid
    parsed = parse_traceparent(CALLER_TRACEPARENT)
    assert parsed is not None and parsed.sampled


def _run(script: str, database_url: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, capture_output=True, text=True,
        timeout=SUBPROCESS_DEADLINE,
        env={**clean, "DATABASE_URL": database_url, "SCHEDULER_JWT_SECRET": TEST_SECRET, **env},
    )


BUILD_AND_SERVE = """
    import sys
    from starlette.testclient import TestClient
    from scheduler.config import Settings
    from scheduler.service import SchedulerService
    service = SchedulerService(Settings.from_env(), run_scheduler=False)
    with TestClient(service.app) as client:
        assert client.get("/health").status_code == 200
        service.scheduler.poll_guarded(lambda: False)
    print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
"""

BLOCK_OPENTELEMETRY = """
    import sys
    class NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "opentelemetry":
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None
    sys.meta_path.insert(0, NotInstalled())
"""


@pytest.mark.clause("TRACE-5")
@pytest.mark.clause("DEC-OBS-1")
@pytest.mark.parametrize("exporter", [None, "none"])
def test_with_tracing_off_opentelemetry_is_never_imported(database_url: str, exporter: str | None) -> None:
    """TRACE-5: OTEL_TRACES_EXPORTER unset or ``none``: a service that serves a request and
    runs a poll has imported no OpenTelemetry module (the extra is installed here)."""
    env = {} if exporter is None else {"OTEL_TRACES_EXPORTER": exporter}
    done = _run(BUILD_AND_SERVE, database_url, **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.clause("TRACE-5")
def test_without_the_extra_the_service_runs_and_asking_for_traces_names_the_extra(database_url: str) -> None:
    """TRACE-5: OpenTelemetry not installed: the service runs untraced; with an exporter asked
    for, building it is a configuration error that names the ``otel`` extra."""
    untraced = _run(BLOCK_OPENTELEMETRY + BUILD_AND_SERVE, database_url)
    assert untraced.returncode == 0, untraced.stderr
    asked = _run(BLOCK_OPENTELEMETRY + BUILD_AND_SERVE, database_url, OTEL_TRACES_EXPORTER="otlp")
    assert asked.returncode != 0
    assert "ConfigError" in asked.stderr and "nudging-scheduler[otel]" in asked.stderr, asked.stderr


@pytest.mark.clause("TRACE-6")
def test_the_console_exporter_prints_the_spans_of_the_service_named_by_otel_service_name(database_url: str) -> None:
    """TRACE-6: OTEL_TRACES_EXPORTER=console and OTEL_SERVICE_NAME configure tracing by
    themselves: the request's, the statements' and the poll's spans are printed, under that
    service name (``scheduler`` by default)."""
    script = BUILD_AND_SERVE + """
    from opentelemetry import trace
    trace.get_tracer_provider().force_flush()
    """
    done = _run(script, database_url, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="reminders-eu")
    assert done.returncode == 0, done.stderr
    assert '"name": "GET /health"' in done.stdout
    assert '"name": "scheduler.poll"' in done.stdout
    assert '"name": "SELECT' in done.stdout  # the claim, by the SQLAlchemy instrumentation
    assert '"service.name": "reminders-eu"' in done.stdout


@pytest.mark.clause("TRACE-6")
def test_an_unknown_traces_exporter_is_a_configuration_error() -> None:
    """TRACE-6: a value we do not support is named, not ignored; ``OTEL_SDK_DISABLED`` wins."""
    assert traces_exporters({"OTEL_TRACES_EXPORTER": "console, otlp"}) == ("console", "otlp")
    assert traces_exporters({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}) == ()
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER"):
        traces_exporters({"OTEL_TRACES_EXPORTER": "zipkin"})
