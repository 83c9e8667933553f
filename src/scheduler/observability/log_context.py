"""What a log line should carry besides its message: the event being dispatched, the replica.

Context variables, so that the loop's thread and each request see their own event id
(anyio copies the context into worker threads). Standard library only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

event_id: ContextVar[str | None] = ContextVar("scheduler_event_id", default=None)

# The replica this process runs as (its heartbeat's id), set once the service is built.
_replica: list[str | None] = [None]


def set_replica(replica_id: str | None) -> None:
    """Name this process's replica in every later log line."""
    _replica[0] = replica_id


def replica() -> str | None:
    return _replica[0]


@contextlib.contextmanager
def event_scope(scheduled_event_id: str) -> Iterator[None]:
    """Log lines inside carry ``event_id``."""
    token = event_id.set(scheduled_event_id)
    try:
        yield
    finally:
        event_id.reset(token)
