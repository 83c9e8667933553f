"""A participant's own time: their time zone, their quiet hours and their calendar day (LOCAL-*).

Pure: no database, no clock. Every function takes the instant it speaks of (an aware
``datetime``, in any zone) and answers in UTC.

One rule turns a local date and wall-clock time into an instant, for every purpose
(a quiet period's start and end, a day's midnight): **the first instant at which the
participant's clock reads that date and time or later** (``first_instant_at``, LOCAL-3).
A time that exists once is that instant; a time skipped by a spring-forward gap (02:30 in
Europe/Berlin on 2027-03-28) is the first instant after the gap (03:00 CEST, 01:00 UTC); a
time that happens twice on a fall-back day is its first occurrence.

Quiet hours are a half-open local interval ``[start, end)`` each local day, wrapping past
midnight when ``end`` is before ``start`` (22:00 to 07:00 ends on the next day). Each
period's bounds are resolved by the rule above, so on a fall-back day the repeated part of
the clock is quiet only on its first pass when a bound falls inside it, and a period whose
start and end both fall inside one gap does not happen that day. Periods that touch (a
day skipped whole, as Pacific/Apia skipped 2011-12-30) are one quiet period.

A participant's day is ``[first instant of its date at 00:00, first instant of the next
date at 00:00)``: 23 or 25 hours at a one-hour DST change, and a day whose midnight falls
in a gap (America/Santiago) starts at the first instant that exists (LOCAL-5).
"""

from __future__ import annotations

import functools
import re
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import Final

TIME_ZONE_FIELD: Final = "time_zone"
QUIET_HOURS_FIELD: Final = "quiet_hours"
# The default zone of a participant without one: the literal behaviour (DEC-4, DEC-LOCAL-TIME).
DEFAULT_TIME_ZONE_NAME: Final = "UTC"
# The longest IANA name is 32 characters (America/Argentina/ComodRivadavia).
MAX_TIME_ZONE_LENGTH: Final = 64
ZONE_EXAMPLE: Final = "an IANA time zone name such as Europe/Berlin or UTC"

# Area/Location names: ASCII letters, digits, '_', '-' and '+', each part starting with a
# letter, parts joined by single slashes. No dot, so no '..'; no leading slash, so no path.
_ZONE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+\-]*(?:/[A-Za-z][A-Za-z0-9_+\-]*)*", re.ASCII)
# Files of a zoneinfo directory that load but are no place a participant lives in: the
# host's own zone (a link to /etc/localtime), the default rules of POSIX TZ strings, the
# placeholder of an unconfigured machine, and the duplicate trees of some distributions.
_NOT_A_PLACE: Final = frozenset({"localtime", "posixrules", "Factory"})
_NOT_A_PLACE_PREFIXES: Final = ("posix/", "right/")

_HH_MM = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])", re.ASCII)
_MICROSECOND: Final = timedelta(microseconds=1)
# The instants the functions accept: far enough inside datetime's range that the local days
# around one can be formed in any zone (every storable instant is inside, DEC-TRIGGER).
EARLIEST_INSTANT: Final = datetime(1, 1, 15, tzinfo=UTC)
LATEST_INSTANT: Final = datetime(9999, 12, 15, tzinfo=UTC)


@dataclass(eq=False)  # not frozen: raising sets __traceback__ (a frozen exception cannot be raised through a with)
class LocalTimeError(ValueError):
    """A time zone or quiet hours a participant cannot have: one ``{field, message}`` per
    problem, the field as a route names it in its 422 (``time_zone``, ``quiet_hours.start``)."""

    errors: tuple[dict[str, str], ...]

    def __str__(self) -> str:
        return "; ".join(f"{e['field']}: {e['message']}" for e in self.errors)

    @classmethod
    def one(cls, field: str, message: str) -> LocalTimeError:
        return cls(({"field": field, "message": message},))


# -- the time zone -------------------------------------------------------------------------


@functools.cache
def _known_zone_names() -> frozenset[str]:
    """The zone names the installed tz database holds (read once: the scan opens every file)."""
    return frozenset(zoneinfo.available_timezones())


def parse_time_zone(value: object, field: str = TIME_ZONE_FIELD) -> zoneinfo.ZoneInfo:
    """The zone ``value`` names, parsed strictly (LOCAL-1), or ``LocalTimeError`` naming ``field``.

    Accepted: exactly a name of the installed tz database, spelt as it spells it (case
    included, on every file system), ASCII, at most 64 characters. Refused: anything else,
    a path (``/etc/localtime``, ``../``, ``Europe//Berlin``), and the files that load but
    are not places (``localtime``, ``posixrules``, ``Factory``, ``posix/...``, ``right/...``).
    Only a name that passed the shape check is quoted back in the message.
    """
    if not isinstance(value, str):
        raise LocalTimeError.one(field, f"must be a string: {ZONE_EXAMPLE}")
    if not value:
        raise LocalTimeError.one(field, f"must not be empty: {ZONE_EXAMPLE}")
    if len(value) > MAX_TIME_ZONE_LENGTH:
        raise LocalTimeError.one(field, f"must be at most {MAX_TIME_ZONE_LENGTH} characters: {ZONE_EXAMPLE}")
    if not _ZONE_NAME.fullmatch(value):
        raise LocalTimeError.one(field, f"must be {ZONE_EXAMPLE}: ASCII letters, digits, '_', '-' and '+' "
                                        "in parts joined by single '/', never a file path")
    if value in _NOT_A_PLACE or value.startswith(_NOT_A_PLACE_PREFIXES):
        raise LocalTimeError.one(field, f"{value!r} is not a place's time zone: use {ZONE_EXAMPLE}")
    if value not in _known_zone_names():
        raise LocalTimeError.one(field, f"unknown time zone {value!r}: use {ZONE_EXAMPLE}")
    try:
        return zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # listed, yet unreadable
        raise LocalTimeError.one(field, f"unknown time zone {value!r}: use {ZONE_EXAMPLE}") from None


def zone_or_default(name: str | None) -> tzinfo:
    """A stored zone name as a zone (``None``: UTC, the default); a name the installed tz
    database no longer holds raises ``LocalTimeError`` (the caller decides what fails)."""
    return UTC if name is None else parse_time_zone(name)


# -- quiet hours ---------------------------------------------------------------------------


@dataclass(frozen=True)
class QuietHours:
    """Local wall-clock hours ``[start, end)`` each day in which nothing is sent; ``end``
    before ``start`` wraps past midnight (22:00 to 07:00). Whole minutes, ``start != end``."""

    start: time
    end: time

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if not isinstance(value, time) or value.tzinfo is not None or value.second or value.microsecond:
                raise ValueError(f"quiet hours' {name} must be a naive time of whole minutes, not {value!r}")
        if self.start == self.end:
            raise ValueError("quiet hours' start and end must differ")

    @property
    def wraps(self) -> bool:
        """The period ends on the next local day (22:00 to 07:00)."""
        return self.end < self.start

    def covers_wall_time(self, wall: time) -> bool:
        """Whether a local wall-clock time is within these hours, on a day without a transition."""
        if self.wraps:
            return wall >= self.start or wall < self.end
        return self.start <= wall < self.end

    def as_json(self) -> dict[str, str]:
        """``{"start": "HH:MM", "end": "HH:MM"}``, as ``parse_quiet_hours`` reads it."""
        return {"start": self.start.strftime("%H:%M"), "end": self.end.strftime("%H:%M")}


def _parse_hh_mm(value: object, field: str, errors: list[dict[str, str]]) -> time | None:
    if value is None:
        errors.append({"field": field, "message": "is required: HH:MM on the 24-hour clock, local time"})
        return None
    if not isinstance(value, str):
        errors.append({"field": field, "message": "must be a string HH:MM on the 24-hour clock"})
        return None
    match = _HH_MM.fullmatch(value)
    if match is None:
        errors.append({"field": field, "message": "must be HH:MM on the 24-hour clock, zero-padded, "
                                                  "from 00:00 to 23:59"})
        return None
    return time(int(match[1]), int(match[2]))


def parse_quiet_hours(value: object, field: str = QUIET_HOURS_FIELD) -> QuietHours | None:
    """``{"start": "HH:MM", "end": "HH:MM"}`` as ``QuietHours``, ``None`` (JSON null) as
    none, parsed strictly (LOCAL-2): exactly those two keys, each zero-padded 24-hour
    ``HH:MM`` (``24:00``, ``7:00``, seconds and offsets refused), ``start != end``. Every
    problem is reported at once, each naming its field (``quiet_hours.start``)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise LocalTimeError.one(field, 'must be an object {"start": "HH:MM", "end": "HH:MM"} or null')
    errors: list[dict[str, str]] = []
    unknown = sorted(str(key) for key in value if key not in ("start", "end"))
    if unknown:
        shown = ", ".join(repr(k) for k in unknown[:5] if k.isascii() and k.isprintable() and len(k) <= 40)
        errors.append({"field": field, "message": "has only start and end" + (f"; unknown: {shown}" if shown else "")})
    start = _parse_hh_mm(value.get("start"), f"{field}.start", errors)
    end = _parse_hh_mm(value.get("end"), f"{field}.end", errors)
    if start is not None and end is not None and start == end:
        errors.append({"field": field, "message": "start and end must differ (null means no quiet hours)"})
    if errors or start is None or end is None:
        raise LocalTimeError(tuple(errors))
    return QuietHours(start, end)


# -- from local time to instants -----------------------------------------------------------


def _utc(instant: datetime) -> datetime:
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"an instant must be timezone-aware, not {instant!r}")
    utc = instant.astimezone(UTC)
    if not EARLIEST_INSTANT <= utc < LATEST_INSTANT:
        raise ValueError(f"{utc.isoformat()} is outside {EARLIEST_INSTANT.isoformat()} to {LATEST_INSTANT.isoformat()}")
    return utc


def _wall(instant: datetime, zone: tzinfo) -> datetime:
    """What the participant's clock reads at ``instant``, as a naive date and time."""
    return instant.astimezone(zone).replace(tzinfo=None)


def first_instant_at(day: date, wall: time, zone: tzinfo) -> datetime:
    """The first instant (UTC) at which the clock in ``zone`` reads ``day`` at ``wall`` or later (LOCAL-3).

    A time that exists once is that instant; one a fall-back repeats is its first
    occurrence; one a spring-forward gap skips is the first instant after the gap.
    """
    target = datetime.combine(day, wall)
    earlier, later = target.replace(tzinfo=zone), target.replace(tzinfo=zone, fold=1)
    if earlier.utcoffset() == later.utcoffset():  # neither repeated nor skipped (PEP 495)
        return earlier.astimezone(UTC)
    candidates = [earlier.astimezone(UTC), later.astimezone(UTC)]
    exact = [c for c in candidates if _wall(c, zone) == target]
    if exact:
        return min(exact)
    # In a gap: PEP 495 puts the two readings on either side of the transition, the
    # earlier before it (the clock reads less than the target there) and the later after
    # it (more). The transition is the first instant the clock reads the target or later.
    low, high = min(candidates), max(candidates)
    while high - low > _MICROSECOND:
        middle = low + (high - low) // 2
        if _wall(middle, zone) >= target:
            high = middle
        else:
            low = middle
    return high


# -- the participant's day -----------------------------------------------------------------


def _day_start(day: date, zone: tzinfo) -> datetime:
    return first_instant_at(day, time(0), zone)


def local_date(instant: datetime, zone: tzinfo) -> date:
    """The participant's calendar date at ``instant``: the date whose day (``local_day_bounds``)
    holds it. That is the date on their clock, save in a fall-back across midnight, whose
    repeated minutes belong to the day that had already begun (LOCAL-5)."""
    utc = _utc(instant)
    day = _wall(utc, zone).date()
    while utc >= _day_start(day + timedelta(days=1), zone):
        day += timedelta(days=1)
    while utc < _day_start(day, zone):
        day -= timedelta(days=1)
    return day


def local_day_bounds(instant: datetime, zone: tzinfo) -> tuple[datetime, datetime]:
    """The participant's local calendar day holding ``instant``, as ``[start, end)`` in UTC (LOCAL-5).

    It starts at the first instant of its date at 00:00 (``first_instant_at``: a midnight
    skipped by a gap starts the day when the gap ends) and ends where the next day starts,
    so consecutive days tile time without gap or overlap; at a DST change it is 24 h minus
    the change (23 h or 25 h for one hour; 23.5 h or 24.5 h on Australia/Lord_Howe).
    """
    day = local_date(instant, zone)
    return _day_start(day, zone), _day_start(day + timedelta(days=1), zone)


# -- quiet hours at an instant -------------------------------------------------------------


def _periods_near(utc: datetime, zone: tzinfo, quiet: QuietHours) -> list[tuple[datetime, datetime]]:
    """The quiet periods of the local days around ``utc``, in order (each starts at or after
    the previous one's end, as ``first_instant_at`` keeps the clock's order). A period whose
    bounds resolve to one instant (both inside one gap) does not happen. The days reach far
    enough for any period holding ``utc`` and the periods that may touch it."""
    today = _wall(utc, zone).date()
    periods = []
    for offset in range(-3, 3):
        day = today + timedelta(days=offset)
        start = first_instant_at(day, quiet.start, zone)
        end = first_instant_at(day + timedelta(days=1) if quiet.wraps else day, quiet.end, zone)
        if start < end:
            periods.append((start, end))
    return periods


def quiet_period(instant: datetime, zone: tzinfo, quiet: QuietHours | None) -> tuple[datetime, datetime] | None:
    """The quiet period holding ``instant`` as ``[start, end)`` in UTC, touching periods
    joined into one (LOCAL-4); ``None`` when ``instant`` is outside quiet hours."""
    utc = _utc(instant)
    if quiet is None:
        return None
    periods = _periods_near(utc, zone, quiet)
    holding = next((i for i, (s, e) in enumerate(periods) if s <= utc < e), None)
    if holding is None:
        return None
    start, end = periods[holding]
    for later_start, later_end in periods[holding + 1:]:
        if later_start != end:
            break
        end = later_end
    for earlier_start, earlier_end in reversed(periods[:holding]):
        if earlier_end != start:
            break
        start = earlier_start
    return start, end


def in_quiet_hours(instant: datetime, zone: tzinfo, quiet: QuietHours | None) -> bool:
    """Whether ``instant`` lies inside the participant's quiet hours in ``zone`` (LOCAL-4);
    never without quiet hours."""
    return quiet_period(instant, zone, quiet) is not None


def quiet_hours_end(instant: datetime, zone: tzinfo, quiet: QuietHours | None) -> datetime | None:
    """The UTC instant the quiet period holding ``instant`` ends, the first instant after it
    that is not quiet (LOCAL-4); ``None`` when ``instant`` is not inside quiet hours.

    What a held reminder's ``not_before`` is (DEC-LOCAL-TIME): strictly after ``instant``,
    the first instant the participant's clock reads ``quiet.end`` or later.
    """
    period = quiet_period(instant, zone, quiet)
    return None if period is None else period[1]
