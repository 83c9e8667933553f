"""What a ``trigger_at`` may be: an instant from 2000-01-01 up to (not including) 9999-01-01, UTC.

PostgreSQL's ``timestamptz`` reaches far past what Python's ``datetime`` can hold (years 1 to
9999, in the zone it is read in), so a time near either end of Python's range is stored and
then cannot be read back in every session zone, or sorts before the claim's keyset start:
stored, never claimed. The range below keeps a wide margin from both ends (DEC-TRIGGER):
nothing a reminder needs lies before 2000, and the zero times senders send when they forgot
the time (Go's ``0001-01-01T00:00:00Z``, Unix time 0) are refused as the mistakes they are.
Its offset stays within what PostgreSQL reads in a ``timestamptz``'s text (under 16 hours
either side of UTC: ``+15:59`` is read, ``+16:00`` refused); every real zone is within 14.

Every path that stores a ``trigger_at`` checks it here: the API's schema (a 422 naming the
field) and ``core.store.store_event`` (the simulation's posts, an embedding host's code).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EARLIEST_TRIGGER = datetime(2000, 1, 1, tzinfo=UTC)  # the first storable instant
LATEST_TRIGGER = datetime(9999, 1, 1, tzinfo=UTC)  # the first instant past the range

# Before every row the table can hold that Python can read (the earliest aware UTC instant):
# where the claim's keyset starts, and what a wake-up without a time stands for ("look now").
BEFORE_EVERY_TRIGGER = datetime.min.replace(tzinfo=UTC)

# PostgreSQL's timestamptz input refuses a displacement of 16 hours or more ("time zone
# displacement out of range"): the set-based store sends its instants as text.
OFFSET_BOUND = timedelta(hours=16)
OFFSET_TEXT = "within \u00b115:59 of UTC (what PostgreSQL reads)"

RANGE_TEXT = f"{EARLIEST_TRIGGER:%Y-%m-%dT%H:%M:%SZ} (included) to {LATEST_TRIGGER:%Y-%m-%dT%H:%M:%SZ} (excluded)"


class TriggerOutOfRange(ValueError):
    """A ``trigger_at`` outside the storable range, not an aware datetime, or with an offset
    PostgreSQL does not read."""


def check_trigger_at(value: datetime) -> datetime:
    """``value`` if it is an aware instant in the storable range, with an offset PostgreSQL
    reads; else ``TriggerOutOfRange`` saying what the range is."""
    offset = value.utcoffset() if value.tzinfo is not None else None
    if offset is None:
        raise TriggerOutOfRange("must be an ISO 8601 instant with its offset (a naive time is ambiguous)")
    if abs(offset) >= OFFSET_BOUND:
        raise TriggerOutOfRange(f"must have an offset {OFFSET_TEXT}, got {value.isoformat()}")
    try:
        utc = value.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59-12:00 is year 10000 in UTC
        utc = LATEST_TRIGGER
    if not EARLIEST_TRIGGER <= utc < LATEST_TRIGGER:
        raise TriggerOutOfRange(f"must be from {RANGE_TEXT}, got {value.isoformat()}")
    return value
