"""What a sender does: store a scheduled event (one, or many together), and send a live one now.

Every adapter runs these: the API's ingest and batch routes, ``scheduler events import``.
Storing validates nothing the adapter has not: the adapter parses and checks the body
(REQ-0063's schema and facts contract); the store keeps ``trigger_at`` within the storable
range, works out the row's expiry (an ``ExpiryRefused`` names the field) and rewrites the
row of a known external key (REQ-0064). A live event goes through the same dispatch path a
scheduled one does (REQ-0066), in one transaction, its result checked by the one dispatch
contract; the caller publishes what it sends after the commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from scheduler.core import store, store_batch
from scheduler.core.dispatch_contract import NotADispatchResult, checked_result
from scheduler.core.expiry import ExpiryRefused, stored_expires_at
from scheduler.core.store_batch import NewEvent, Stored
from scheduler.types import DigitalTwinEvent, Dispatcher, DispatchResult

logger = logging.getLogger(__name__)


def store_scheduled_event(
    sessions: sessionmaker[Session],
    *,
    event_type: str,
    user_id: str,
    community_id: str | None,
    external_key: str | None,
    trigger_at: datetime,
    facts: Mapping[str, Any],
    now: datetime,
    actor: str | None = None,
    traceparent: str | None = None,
    expires_at: datetime | None = None,
    default_expiry: timedelta | None = None,
) -> dict[str, Any]:
    """Store one scheduled event (a new row, or its key's row rewritten and reset), in its own
    transaction; the row as the API shows it. ``ExpiryRefused`` if its expiry cannot be stored."""
    return store.store_event(
        sessions, event_type=event_type, user_id=user_id, community_id=community_id,
        external_key=external_key, trigger_at=trigger_at, facts=facts, now=now, actor=actor,
        traceparent=traceparent, expires_at=expires_at, default_expiry=default_expiry)


def store_scheduled_events(sessions: sessionmaker[Session], events: Sequence[NewEvent], *, now: datetime,
                           actor: str | None = None, traceparent: str | None = None) -> list[Stored]:
    """Store ``events`` together, in one transaction (all or none) of a fixed number of
    statements (DEC-BATCH); one ``Stored`` per event, in order."""
    return store_batch.store_events(sessions, events, now=now, actor=actor, traceparent=traceparent)


def dispatch_live(sessions: sessionmaker[Session], dispatcher: Dispatcher, event: DigitalTwinEvent,
                  now: datetime, *, dispatched: Callable[[DispatchResult], None] = lambda result: None,
                  ) -> DispatchResult:
    """Send a live event through the dispatch path now, in one transaction: committed with its
    notifications, or rolled back when a rule refused it. ``dispatched`` is told the result
    first (the live dispatch's span). A dispatcher that breaks its contract is a
    ``NotADispatchResult`` (the host's bug, logged here), after a rollback."""
    with sessions() as session:
        try:
            result = checked_result(dispatcher(session, event, now))
        except NotADispatchResult as exc:
            # a broken host dispatcher, not the sender's fault: the adapter fails, the log says why
            logger.error("live dispatch of a %r event failed: %s", event.event_type, exc)
            session.rollback()
            raise
        dispatched(result)
        if result.refusal is not None:
            session.rollback()
            return result
        session.commit()
    return result


__all__ = ["ExpiryRefused", "NewEvent", "NotADispatchResult", "Stored", "dispatch_live", "store_scheduled_event",
           "store_scheduled_events", "stored_expires_at"]
