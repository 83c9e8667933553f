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
from collections.abc import Callable
from datetime import datetime, timedelta

from scheduler.core import poll, store, store_batch
from scheduler.core.store import ExpiryRefused, stored_expires_at
from scheduler.core.store_batch import NewEvent, Stored
from scheduler.database.database import Database
from scheduler.types import (
    DigitalTwinEvent,
    Dispatcher,
    DispatchOutcome,
    DispatchResult,
    NotADispatchResult,
    checked_result,
)

logger = logging.getLogger(__name__)


# Storing is the core's (``core.store``, ``core.store_batch``); the adapters reach it here, so
# that the edge depends on this layer only (ARCH-5), under the names of what a sender does.
# One event: a new row, or its key's row rewritten and reset, in its own transaction; the row
# as the API shows it (``ExpiryRefused`` if its expiry cannot be stored).
store_scheduled_event = store.store_event
# The same store in the caller's transaction (a host's own code: ``scheduler.schedule``).
store_scheduled_event_in = store.store_event_in
# Many together, in one transaction (all or none) of a fixed number of statements
# (DEC-BATCH); one ``Stored`` per event, in order.
store_scheduled_events = store_batch.store_events
# What a committed dispatch sends leaves the process by the core's one publish path, the loop's
# and the live route's alike: a failed push is logged there (``scheduler.core.poll``), by
# the code that publishes, whichever parts are mounted (CTX-DELIVERY.3).
publish_committed = poll.publish_committed


def dispatch_live(database: Database, dispatcher: Dispatcher, event: DigitalTwinEvent,
                  now: datetime, *, dispatched: Callable[[DispatchResult], None] = lambda result: None,
                  default_expiry: timedelta | None = None, traceparent: str | None = None,
                  ) -> DispatchResult:
    """Send a live event through the dispatch path now, in one transaction: committed with its
    notifications, or rolled back when a rule refused it. ``dispatched`` is told the result
    first (the live dispatch's span). A dispatcher that breaks its contract is a
    ``NotADispatchResult`` (the host's bug, logged here), after a rollback.

    An event its participant's quiet hours hold (``DEFERRED``) is stored, in the same
    transaction, as a scheduled row due at ``not_before`` with ``default_expiry``'s window
    (QUIET-7: one path, REQ-0066); the result's ``detail`` is that row as the API shows it."""
    with database() as session:
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
        if result.outcome is DispatchOutcome.DEFERRED and result.not_before is not None:
            result.detail = store.store_held_live_event(session, database.events, event, now=now,
                                                        not_before=result.not_before,
                                                        default_expiry=default_expiry, traceparent=traceparent)
        session.commit()
    return result


__all__ = ["ExpiryRefused", "NewEvent", "NotADispatchResult", "Stored", "dispatch_live", "store_scheduled_event",
           "store_scheduled_event_in", "store_scheduled_events", "stored_expires_at"]
