"""What an ``expires_at`` may be, and the service-wide default window (EXP-1, EXP-5, DEC-EXPIRY).

A scheduled event may carry ``expires_at``: claimed after it (by the service's clock, the
``:now`` the claim binds), the row is not dispatched but ends ``expired`` (``claim_due_events``).
It must be an aware instant after ``trigger_at`` and inside the storable range of
``core.trigger_range`` (a time Python cannot read back in every session zone would be stored
and then unreadable). A row without one gets the service's default window, measured from its
``trigger_at`` (never from when it was stored: a delayed reminder is not born expired), when a
window is set (``SCHEDULER_DEFAULT_EXPIRY_SECONDS``); the sum is kept to the same range. The
result is stored on the row, so a later change of the setting rewrites nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from scheduler.core.trigger_range import (
    LATEST_TRIGGER,
    RANGE_TEXT,
    TriggerOutOfRange,
    check_trigger_at,
)


class ExpiryRefused(ValueError):
    """An ``expires_at`` that cannot be stored; ``field`` names the field the 422 names."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def check_expires_at(trigger_at: datetime, expires_at: datetime) -> datetime:
    """``expires_at`` if it is an aware instant in the storable range after ``trigger_at``;
    else ``ExpiryRefused`` naming ``expires_at``."""
    try:
        check_trigger_at(expires_at)
    except TriggerOutOfRange as exc:
        raise ExpiryRefused("expires_at", str(exc)) from None
    if expires_at <= trigger_at:
        raise ExpiryRefused("expires_at", f"must be after trigger_at ({trigger_at.isoformat()}), "
                                          f"got {expires_at.isoformat()}")
    return expires_at


def stored_expires_at(trigger_at: datetime, expires_at: datetime | None,
                      default_window: timedelta | None) -> datetime | None:
    """The ``expires_at`` a row is stored with: the sender's (checked), else ``trigger_at``
    plus the default window when one is set, else none (REQ-0065's literal behaviour)."""
    if expires_at is not None:
        return check_expires_at(trigger_at, expires_at)
    if default_window is None:
        return None
    try:
        default = trigger_at + default_window
        check_trigger_at(default)
    except (OverflowError, TriggerOutOfRange):
        raise ExpiryRefused("trigger_at", f"with the service's default expiry window ({default_window}) its "
                                          f"expires_at would fall outside {RANGE_TEXT}; send an earlier "
                                          "trigger_at or an expires_at of its own") from None
    return default


# The last instant the storable range holds (``LATEST_TRIGGER`` is the first one past it).
LAST_STORABLE = LATEST_TRIGGER - timedelta(microseconds=1)


def held_expires_at(arrived_at: datetime, default_window: timedelta | None) -> datetime | None:
    """The ``expires_at`` of a live event its participant's quiet hours held (QUIET-7): its
    arrival plus the default window, or the last storable instant when the window reaches
    past the range (QUIET-9). The sender sent no time to correct, so nothing is refused:
    no claim inside the range can come after either."""
    if default_window is None:
        return None
    try:
        return stored_expires_at(arrived_at, None, default_window)
    except ExpiryRefused:
        return LAST_STORABLE
