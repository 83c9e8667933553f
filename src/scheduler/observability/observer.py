"""What the loop and the HTTP edge tell observability, and the default that traces nothing.

``Observer`` is the whole interface: a context around each poll and each event's dispatch
(the loop), around a live event's dispatch (``POST /admin/ingest-event``) and a batch store, and the trace
context a stored row keeps. This default keeps the log context only (the event id of the
dispatch under way) and costs a context variable per event; ``otel.TracingObserver`` adds
the spans. Standard library only: the loop imports it whether tracing is installed or not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from scheduler.observability.log_context import event_scope
from scheduler.observability.traceparent import normalized

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from starlette.applications import Starlette

    from scheduler.types import ClaimedEvent, DispatchResult, EventOutcome, PollReport

DispatchDone = Callable[["EventOutcome | None"], None]
LiveDone = Callable[["DispatchResult"], None]
BatchDone = Callable[[int, int], None]  # (stored, refused)


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
    def store_batch(self, count: int) -> Iterator[BatchDone]:
        """Around one batch store (``POST /admin/scheduled-events/batch``) of ``count`` items;
        call the yielded function with how many were stored and refused."""
        yield _ignore_counts

    def storing_traceparent(self, header: str | None) -> str | None:
        """The ``traceparent`` a row stored by the current request keeps: without tracing,
        the caller's header if it is valid (a replica that traces can still link to it)."""
        return normalized(header)
