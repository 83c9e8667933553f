"""What the loop and the HTTP edge tell observability, and the default that traces nothing.

``Observer`` is the whole interface: a context around each poll and each event's dispatch
(the loop), around a live event's dispatch (``POST /admin/ingest-event``) and a bulk store,
and the trace context a stored row keeps. This default keeps the log context only and costs
a context variable per event; ``otel.TracingObserver`` adds the spans. Standard library only:
the loop imports it whether tracing is installed or not.

Also here, as both observers use them: the log context (what a log line carries besides its
message: the event being dispatched, the replica), and the W3C ``traceparent`` header, parsed
strictly in one place (https://www.w3.org/TR/trace-context/#traceparent-header).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from contextvars import Context, ContextVar, copy_context
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from starlette.applications import Starlette
    from starlette.types import ASGIApp, Receive, Scope, Send

    from scheduler.types import ClaimedEvent, DispatchResult, EventOutcome, PollReport

DispatchDone = Callable[["EventOutcome | None"], None]
LiveDone = Callable[["DispatchResult"], None]
BulkDone = Callable[[int, int], None]  # (stored, refused)


def _ignore(_: object) -> None:
    return None


def _ignore_counts(stored: int, refused: int) -> None:
    return None


class PollRecord:
    """What a poll's observer learns when it ends: its report, or that it failed."""

    def completed(self, report: PollReport) -> None:
        """The poll committed with ``report``."""

    def failed(self, error: str | None) -> None:
        """The poll failed as a whole (REQ-0067); ``error`` is its ``last_error``."""


class Observer:
    """Observes polls and dispatches; this base class records no spans."""

    tracing = False

    def instrument(self, app: Starlette | None, engines: Sequence[Engine]) -> None:
        """Trace the app's requests and the engines' statements (nothing to do here)."""

    @contextlib.contextmanager
    def poll(self, replica_name: str, mode: str) -> Iterator[PollRecord]:
        """Around one poll of the loop (claim, dispatches, finish, poll hooks)."""
        yield PollRecord()

    @contextlib.contextmanager
    def dispatch(self, event: ClaimedEvent) -> Iterator[DispatchDone]:
        """Around one claimed event's dispatch; call the yielded function with its outcome."""
        with event_scope(event.id):
            yield _ignore

    @contextlib.contextmanager
    def live_dispatch(self, event_type: str) -> Iterator[LiveDone]:
        """Around a live event's dispatch; call the yielded function with its result."""
        yield _ignore

    @contextlib.contextmanager
    def store_bulk(self, count: int) -> Iterator[BulkDone]:
        """Around one bulk store (``POST /admin/scheduled-events/bulk``) of ``count`` items;
        call the yielded function with how many were stored and refused."""
        yield _ignore_counts

    def storing_traceparent(self, header: str | None) -> str | None:
        """The ``traceparent`` a row stored by the current request keeps: without tracing,
        the caller's header if it is valid (a replica that traces can still link to it)."""
        return normalized_traceparent(header)


# -- the log context: context variables, so that the loop's thread and each request see their
# own event id (anyio copies the context into worker threads) ------------------------------

current_event_id: ContextVar[str | None] = ContextVar("scheduler_event_id", default=None)

# The replica whose code runs here (its heartbeat's id): each service sets it in the contexts
# it runs (its tasks, its loop's polls, its requests), never for the process (OBS-8).
current_replica: ContextVar[str | None] = ContextVar("scheduler_replica", default=None)


@contextlib.contextmanager
def replica_scope(replica_id: str | None) -> Iterator[None]:
    """Log lines inside carry ``replica`` (``None``: whatever the caller's context says)."""
    if replica_id is None:
        yield
        return
    token = current_replica.set(replica_id)
    try:
        yield
    finally:
        current_replica.reset(token)


def replica_context(replica_id: str | None) -> Context:
    """A copy of the current context in which log lines carry ``replica_id`` (a task's, a thread's)."""
    context = copy_context()
    if replica_id is not None:
        context.run(current_replica.set, replica_id)
    return context


class ReplicaMiddleware:
    """ASGI middleware: a request's log lines carry the replica of the service that serves it."""

    def __init__(self, app: ASGIApp, replica_id: str) -> None:
        self.app, self.replica_id = app, replica_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with replica_scope(self.replica_id):
            await self.app(scope, receive, send)


@contextlib.contextmanager
def event_scope(scheduled_event_id: str) -> Iterator[None]:
    """Log lines inside carry ``event_id``."""
    token = current_event_id.set(scheduled_event_id)
    try:
        yield
    finally:
        current_event_id.reset(token)


# -- the W3C traceparent header ------------------------------------------------------------

_FIELDS = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
MAX_HEADER_LENGTH = 512  # a future version may append fields; nothing sane is longer


@dataclass(frozen=True)
class TraceParent:
    """A valid trace context: the trace, the parent span in it, and the trace flags."""

    trace_id: int
    span_id: int
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 0x01)

    def header(self) -> str:
        """The version-00 header (55 characters), as stored in ``scheduled_events.traceparent``."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags:02x}"


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The trace context of a ``traceparent`` value, or ``None`` if absent or invalid: a header
    that does not parse is ignored, as the recommendation asks (the request is served, the row
    keeps no trace context).

    Version 00 has exactly four fields; a later version may append more after a dash, and its
    first four are read (the recommendation's forward compatibility). Version ``ff``, an
    all-zero trace or span id, and upper-case hex are invalid.
    """
    if value is None:
        return None
    value = value.strip(" \t")
    if len(value) > MAX_HEADER_LENGTH:
        return None
    match = _FIELDS.match(value)
    if match is None:
        return None
    version, trace_hex, span_hex, flags_hex = match.groups()
    rest = value[match.end():]
    if version == "ff" or (version == "00" and rest) or (rest and not rest.startswith("-")):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if trace_id == 0 or span_id == 0:
        return None
    return TraceParent(trace_id, span_id, int(flags_hex, 16))


def normalized_traceparent(value: str | None) -> str | None:
    """The stored form of a header: its version-00 rendering, or ``None`` if invalid."""
    parsed = parse_traceparent(value)
    return parsed.header() if parsed else None
