"""OpenTelemetry traces, from the request that stores a row to the dispatch that sends it.

Imported only when tracing is configured (``tracing.observer_from_env``) or by a caller that
passes its own ``TracerProvider`` (tests, an embedding app): it needs the ``otel`` extra.

Spans:
- every HTTP request, by ``opentelemetry-instrumentation-starlette``; the URL attributes
  are rewritten to the route template (``/admin/participants/{user_id}/preferences``) so
  that no participant id from a path or a query string lands in an attribute;
- every SQL statement, by ``opentelemetry-instrumentation-sqlalchemy``'s per-engine tracer
  (the one ``SQLAlchemyInstrumentor().instrument(engine=...)`` returns, without that call's
  process-wide patches of ``create_engine``, so two services in one process do not collide);
- ``scheduler.poll``: one poll of the loop, with the heartbeat and retention hooks after it;
- ``scheduler.dispatch``: one claimed event, a child of its poll, with a **link** to the span
  of the request that stored it (``scheduled_events.traceparent``);
- ``scheduler.ingest``: a live event's dispatch (``POST /admin/ingest-event``);
- ``scheduler.store_bulk``: one bulk store (``POST /admin/scheduled-events/bulk``), with
  the number of items, stored and refused.

Attributes name events by id and type, never by participant or community.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer
from opentelemetry.instrumentation.sqlalchemy.version import (
    __version__ as _sqlalchemy_instrumentation_version,
)
from opentelemetry.instrumentation.starlette import StarletteInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from sqlalchemy import Engine
from starlette.applications import Starlette

from scheduler.config import ConfigError
from scheduler.observability.observer import (
    BulkDone,
    DispatchDone,
    LiveDone,
    Observer,
    PollRecord,
    TraceParent,
    event_scope,
    parse_traceparent,
)

if TYPE_CHECKING:
    from scheduler.types import ClaimedEvent, DispatchResult, EventOutcome, PollReport

TRACER_NAME = "scheduler"
DEFAULT_SERVICE_NAME = "scheduler"

# Attribute names (the scheduler.* namespace; OpenTelemetry's own conventions elsewhere).
EVENT_ID = "scheduler.event.id"
EVENT_TYPE = "scheduler.event.type"
EVENT_OUTCOME = "scheduler.event.outcome"
EVENT_LATENESS = "scheduler.event.lateness_seconds"
REPLICA = "scheduler.replica"
MODE = "scheduler.mode"
POLL_CLAIMED = "scheduler.poll.claimed"
POLL_DISPATCHED = "scheduler.poll.dispatched"
POLL_FAILED = "scheduler.poll.failed"
POLL_SKIPPED = "scheduler.poll.skipped_busy"
LINK_REASON = "scheduler.link"
BULK_COUNT = "scheduler.bulk.count"
BULK_STORED = "scheduler.bulk.stored"
BULK_REFUSED = "scheduler.bulk.refused"

# What the HTTP instrumentation records of a URL, in its old and its stable conventions:
# each is rewritten to the route template (paths and queries may hold participant ids).
_URL_ATTRIBUTES = ("http.target", "http.url", "url.path", "url.full")
_QUERY_ATTRIBUTES = ("url.query",)
UNMATCHED_ROUTE = "(unmatched route)"


def _scrub_url(span: trace.Span, scope: dict[str, Any]) -> None:
    """The HTTP span's server-request hook: URLs become their route template."""
    attributes: Mapping[str, Any] = getattr(span, "attributes", None) or {}
    route = str(attributes.get("http.route") or UNMATCHED_ROUTE)
    for key in _URL_ATTRIBUTES:
        if key in attributes:
            span.set_attribute(key, route)
    for key in _QUERY_ATTRIBUTES:
        if key in attributes:
            span.set_attribute(key, "")


_LEADING_LINE_COMMENTS = re.compile(r"^(?:\s*--[^\n]*\n)+")


class _StatementTracer(EngineTracer):
    """The package's per-engine tracer, naming a span by its statement's first word even
    when ``--`` comments come first (ours explain themselves: ``sql/queries.sql``); the
    package skips only ``/* */`` comments and would call the span ``--``."""

    def _operation_name(self, db_name: Any, statement: Any) -> Any:
        if isinstance(statement, str):
            statement = _LEADING_LINE_COMMENTS.sub("", statement)
        return super()._operation_name(db_name, statement)  # type: ignore[no-untyped-call]  # untyped package


def span_context_of(stored: str | None) -> SpanContext | None:
    """The remote span context a stored ``traceparent`` names, for a link."""
    parsed = parse_traceparent(stored)
    if parsed is None:
        return None
    return SpanContext(parsed.trace_id, parsed.span_id, is_remote=True, trace_flags=TraceFlags(parsed.flags))


class _PollSpan(PollRecord):
    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def completed(self, report: PollReport) -> None:
        self.span.set_attributes({
            POLL_CLAIMED: report.claimed,
            POLL_DISPATCHED: report.dispatched,
            POLL_FAILED: report.failed,
            POLL_SKIPPED: report.skipped,
        })

    def failed(self, error: str | None) -> None:
        # The error's text stays in /health/scheduler and the log: it may quote anything.
        self.span.set_status(Status(StatusCode.ERROR, "poll failed; see /health/scheduler's last_error"))


class TracingObserver(Observer):
    """The observer that records spans with ``tracer_provider`` (default: the global one)."""

    tracing = True

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.provider = tracer_provider or trace.get_tracer_provider()
        self.tracer = self.provider.get_tracer(TRACER_NAME)
        self._sql_tracer = self.provider.get_tracer(
            "opentelemetry.instrumentation.sqlalchemy", _sqlalchemy_instrumentation_version
        )
        self._instrumented_engines: list[Engine] = []

    @classmethod
    def from_env(cls, exporters: Sequence[str], env: Mapping[str, str] | None = None) -> TracingObserver:
        """The observer for ``OTEL_TRACES_EXPORTER``: a provider that exports to ``exporters``
        (built once per process and made global), or the provider the host application
        already made global, untouched."""
        return cls(global_provider(exporters, os.environ if env is None else env))

    # -- instrumentation -------------------------------------------------------------------

    def instrument(self, app: Starlette | None, engines: Sequence[Engine]) -> None:
        if app is not None:
            StarletteInstrumentor.instrument_app(app, tracer_provider=self.provider, server_request_hook=_scrub_url)
        for engine in engines:
            if any(engine is done for done in self._instrumented_engines):
                continue  # the loop may share the requests' engine
            connections = metrics.get_meter(__name__).create_up_down_counter(
                "db.client.connections.usage", unit="connections")
            _StatementTracer(self._sql_tracer, engine, connections)  # type: ignore[no-untyped-call]  # untyped base
            self._instrumented_engines.append(engine)

    # -- the loop --------------------------------------------------------------------------

    @contextlib.contextmanager
    def poll(self, replica_name: str, mode: str) -> Iterator[PollRecord]:
        attributes = {REPLICA: replica_name, MODE: mode}
        with self.tracer.start_as_current_span("scheduler.poll", attributes=attributes) as span:
            yield _PollSpan(span)

    @contextlib.contextmanager
    def dispatch(self, event: ClaimedEvent) -> Iterator[DispatchDone]:
        stored_by = span_context_of(event.traceparent)
        links = [Link(stored_by, {LINK_REASON: "stored_by"})] if stored_by is not None else []
        attributes = {EVENT_ID: event.id, EVENT_TYPE: event.event_type}
        with (
            event_scope(event.id),
            self.tracer.start_as_current_span(
                "scheduler.dispatch", kind=SpanKind.CONSUMER, links=links, attributes=attributes
            ) as span,
        ):
            def done(outcome: EventOutcome | None) -> None:
                if outcome is None:
                    return
                span.set_attribute(EVENT_OUTCOME, str(outcome.status))
                if outcome.finished_at is not None and outcome.trigger_at is not None:
                    span.set_attribute(EVENT_LATENESS, (outcome.finished_at - outcome.trigger_at).total_seconds())
                if outcome.error is not None:
                    span.set_status(Status(StatusCode.ERROR, "event failed; see the row's last_error"))

            yield done

    @contextlib.contextmanager
    def live_dispatch(self, event_type: str) -> Iterator[LiveDone]:
        with self.tracer.start_as_current_span("scheduler.ingest", attributes={EVENT_TYPE: event_type}) as span:
            def done(result: DispatchResult) -> None:
                span.set_attribute(EVENT_OUTCOME, str(result.outcome))

            yield done

    # -- the store -------------------------------------------------------------------------

    @contextlib.contextmanager
    def store_bulk(self, count: int) -> Iterator[BulkDone]:
        with self.tracer.start_as_current_span("scheduler.store_bulk", attributes={BULK_COUNT: count}) as span:
            def done(stored: int, refused: int) -> None:
                span.set_attributes({BULK_STORED: stored, BULK_REFUSED: refused})

            yield done

    def storing_traceparent(self, header: str | None) -> str | None:
        """The current span (the POST's server span, a child of the caller's ``traceparent``
        if it sent one): the span a dispatch links back to."""
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return super().storing_traceparent(header)
        return TraceParent(context.trace_id, context.span_id, int(context.trace_flags)).header()


_global: list[TracerProvider] = []


def global_provider(exporters: Sequence[str], env: Mapping[str, str]) -> trace.TracerProvider:
    """The process's tracer provider for ``exporters``; made global the first time.

    A host application that set its own SDK provider keeps it (and its exporters): the
    service's spans join the host's."""
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    if _global:
        return _global[0]
    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in (env.get("OTEL_RESOURCE_ATTRIBUTES") or "")
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the sampler is
    # the SDK's, from OTEL_TRACES_SAMPLER (default: parent-based, always on).
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": DEFAULT_SERVICE_NAME}))
    for name in exporters:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, env)))
    trace.set_tracer_provider(provider)
    _global.append(provider)
    return provider


def _exporter(name: str, env: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "grpc").strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter()  # endpoint, headers, TLS from OTEL_EXPORTER_OTLP_*
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        return HttpExporter()
    raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL must be grpc or http/protobuf, got {protocol!r}")
