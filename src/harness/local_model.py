"""The local-time scenario's world and model: participants with zones and quiet hours of their
own, a start near a DST change, the broken variants, and what a claim must do (SIM-LOCAL-*).

Each participant gets a seeded zone (the odd ones among them: Pacific/Kiritimati +14,
Pacific/Pago_Pago -11, Asia/Kathmandu +05:45, Australia/Lord_Howe's half-hour DST), seeded
quiet hours (some wrapping midnight, some inside a DST gap or over a repeated hour, some
none) and a daily cap. The run starts a seeded while before a spring-forward or a fall-back
of one of the DST zones (found by scanning the tz database, never written down), so its clock
crosses it. The model holds every row as the scheduler must leave it and predicts each poll
exactly; the answers about local time are ``scheduler.nudging.local_time``'s (LOCAL-*, proved
on their own by the property tests), the one meaning of "quiet" and "their day".
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from harness.broken import Replace, Variant, VariantNoLongerApplies
from scheduler.nudging.local_time import QuietHours, in_quiet_hours, local_date, quiet_hours_end

# The zones participants are given: every one of the brief's, odd offsets and DST rules alike.
ZONES = ("Pacific/Kiritimati", "Pacific/Pago_Pago", "Asia/Kathmandu", "Australia/Lord_Howe",
         "Europe/Berlin", "America/New_York", "UTC")
# The zones whose DST changes a run starts before (the others have none).
DST_ZONES = ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe")
# Quiet hours (start, end) in local minutes; None: none. Wrapping nights, a night over the
# 02:00 to 03:00 gap and repeated hour, one inside Lord_Howe's half-hour gap, a midday.
QUIET_CHOICES: tuple[tuple[int, int] | None, ...] = (
    (22 * 60, 7 * 60), (23 * 60 + 30, 6 * 60 + 15), (1 * 60 + 30, 3 * 60 + 30), (2 * 60, 2 * 60 + 20),
    (12 * 60, 14 * 60), None, None,
)
# Where the scan for DST changes looks: a year around the simulations' dates.
SCAN_FROM = datetime(2026, 7, 1, tzinfo=UTC)
SCAN_TO = datetime(2027, 7, 1, tzinfo=UTC)


@functools.cache
def transitions(zone_name: str) -> tuple[datetime, ...]:
    """The instants in [SCAN_FROM, SCAN_TO) at which ``zone_name``'s offset changes, to the second."""
    zone = ZoneInfo(zone_name)
    found: list[datetime] = []
    step = timedelta(minutes=30)
    at = SCAN_FROM
    offset = at.astimezone(zone).utcoffset()
    while at < SCAN_TO:
        nxt = at + step
        later = nxt.astimezone(zone).utcoffset()
        if later != offset:
            low, high = at, nxt  # the offset at low is the old one, at high the new one
            while high - low > timedelta(seconds=1):
                mid = low + (high - low) / 2
                if mid.astimezone(zone).utcoffset() == offset:
                    low = mid
                else:
                    high = mid
            found.append(high.replace(microsecond=0))
            offset = later
        at = nxt
    return tuple(found)


@dataclass(frozen=True)
class Participant:
    """One participant of the run: their id, zone, quiet hours (None: none) and daily cap."""

    user: str
    zone_name: str
    quiet: QuietHours | None
    cap: int

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.zone_name)

    def quiet_at(self, instant: datetime) -> bool:
        return self.quiet is not None and in_quiet_hours(instant, self.zone, self.quiet)

    def hold_until(self, instant: datetime) -> datetime | None:
        return None if self.quiet is None else quiet_hours_end(instant, self.zone, self.quiet)

    def day_of(self, instant: datetime) -> date:
        return local_date(instant, self.zone)

    def describe(self) -> str:
        quiet = "no quiet hours" if self.quiet is None else f"quiet {self.quiet.start:%H:%M}-{self.quiet.end:%H:%M}"
        return f"{self.user}: {self.zone_name}, {quiet}, cap {self.cap}"


def _clock_time(minutes: int) -> time:
    return time(minutes // 60, minutes % 60)


def seeded_world(rng: random.Random, participants: int) -> tuple[datetime, str, list[Participant]]:
    """The run's start, the DST change it starts before (``zone@instant``) and its participants.

    Participant 0 has the zone whose change the run crosses; the others cycle through the
    other zones from a seeded place, so a run of seven participants has each zone once."""
    zone_name = rng.choice(DST_ZONES)
    change = rng.choice(transitions(zone_name))
    start = change - timedelta(minutes=rng.randrange(30, 12 * 60))
    others = [z for z in ZONES if z != zone_name]
    first = rng.randrange(len(others))
    people: list[Participant] = []
    for i in range(participants):
        name = zone_name if i == 0 else others[(first + i - 1) % len(others)]
        quiet_choice = rng.choice(QUIET_CHOICES)
        quiet = None if quiet_choice is None else QuietHours(_clock_time(quiet_choice[0]), _clock_time(quiet_choice[1]))
        people.append(Participant(f"p{i}", name, quiet, 1 + rng.randrange(3)))
    return start, f"{zone_name}@{change:%Y-%m-%dT%H:%M:%SZ}", people


# -- the broken variants: each the production scheduler with one local-time mistake ----------------


def _utc_cap_day(sql: str, params: Any) -> tuple[str, Any]:
    """The decision's read of the sends the cap counts covers the UTC day holding now (DEC-4's
    old window) instead of 48 hours either side: the participant's day is counted only where
    it overlaps that UTC day."""
    if "sent_recently" not in sql or not isinstance(params, Mapping):
        return sql, params
    if "window_start" not in params or "window_end" not in params:
        raise VariantNoLongerApplies("the decision's read no longer takes window_start and window_end")
    start = params["window_start"]
    start = datetime.fromisoformat(start) if isinstance(start, str) else start
    now = start + timedelta(hours=48)  # orchestrator.CAP_WINDOW either side of now
    utc = now.astimezone(UTC)
    midnight = datetime(utc.year, utc.month, utc.day, tzinfo=UTC)
    return sql, {**params, "window_start": midnight, "window_end": midnight + timedelta(days=1)}


LOCAL_VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("correct", "the production scheduler, unchanged", None),
        Variant("ignores-not-before", "the claim takes rows by trigger_at <= now: a held row is claimed "
                "(and held again) at every poll before its not_before", "SIM-LOCAL-3",
                rewrites=(Replace(r"AND due_at <= (\S+)", r"AND trigger_at <= \1"),)),
        Variant("utc-cap-day", "the cap reads the sends of the UTC day holding now, not the participant's "
                "whole local day", "SIM-LOCAL-2", rewrites=(_utc_cap_day,)),
        Variant("ignores-quiet-hours", "the decision reads no quiet hours: nothing is held", "SIM-LOCAL-1",
                rewrites=(Replace(r"to_char\(p\.quiet_hours_start, 'HH24:MI'\)", "NULL", claim_only=False),)),
        Variant("utc-quiet-hours", "the decision reads every participant's zone as UTC: quiet hours and the "
                "cap's day on the UTC clock (caught holding in daylight, SIM-LOCAL-3, or sending at night, "
                "SIM-LOCAL-1)", "SIM-LOCAL-3",
                rewrites=(Replace(r"p\.max_per_day, p\.time_zone,", "p.max_per_day, NULL,", claim_only=False),)),
    )
}


def local_variant(name: str) -> Variant:
    try:
        return LOCAL_VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown local-time variant {name!r}; choose one of {', '.join(LOCAL_VARIANTS)}") from None


# -- the model ------------------------------------------------------------------------------------


@dataclass
class LocalRow:
    """One scheduled row as the scheduler must leave it."""

    id: str
    user: str
    trigger_at: datetime
    expires_at: datetime | None
    key: str | None = None
    status: str = "pending"
    not_before: datetime | None = None
    # the poll after not_before found a full batch before it: dispatched later than one interval
    waited_for_batch: bool = False
    holds: int = 0

    @property
    def due_at(self) -> datetime:
        return self.not_before or self.trigger_at


@dataclass
class PollExpectation:
    """What one poll at ``now`` must do: the rows it claims (in order), holds, and ends expired."""

    now: datetime
    claimed: list[str] = field(default_factory=list)
    held: dict[str, datetime] = field(default_factory=dict)  # row id -> its new not_before
    dispatched: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)


class LocalModel:
    """The rows of a run and each poll's prediction (a single poll at a time: no contention)."""

    def __init__(self, participants: list[Participant], batch_size: int) -> None:
        self.participants = {p.user: p for p in participants}
        self.batch_size = batch_size
        self.rows: dict[str, LocalRow] = {}
        self.by_key: dict[str, str] = {}

    def post(self, row_id: str, user: str, trigger_at: datetime, expires_at: datetime | None,
             key: str | None) -> LocalRow:
        """A post committed: a new row, or its key's row rewritten, pending, its hold cleared (QUIET-5)."""
        existing = self.by_key.get(key) if key is not None else None
        if existing is not None:
            row = self.rows[existing]
            row.trigger_at, row.expires_at, row.user = trigger_at, expires_at, user
            row.status, row.not_before, row.waited_for_batch = "pending", None, False
            return row
        row = LocalRow(row_id, user, trigger_at, expires_at, key)
        self.rows[row_id] = row
        if key is not None:
            self.by_key[key] = row_id
        return row

    def deferred_live(self, row_id: str, user: str, now: datetime, not_before: datetime,
                      expires_at: datetime | None) -> LocalRow:
        """A live event held in quiet hours: a scheduled row due at ``not_before`` (QUIET-7)."""
        row = LocalRow(row_id, user, now, expires_at, not_before=not_before, holds=1)
        self.rows[row_id] = row
        return row

    def expect_poll(self, now: datetime) -> PollExpectation:
        """The claim's rows at ``now`` (due_at <= now, not past expiry, by (due_at, id), at most
        the batch), those it ends expired (expires_at < now, by (expires_at, id), at most the
        batch), and each claimed row's decision: held again in quiet hours, else dispatched."""
        expect = PollExpectation(now)
        pending = [r for r in self.rows.values() if r.status == "pending"]
        past = sorted((r for r in pending if r.expires_at is not None and r.expires_at < now),
                      key=lambda r: (r.expires_at or now, r.id))
        expect.expired = [r.id for r in past[:self.batch_size]]
        due = sorted((r for r in pending if r.due_at <= now and (r.expires_at is None or r.expires_at >= now)),
                     key=lambda r: (r.due_at, r.id))
        for row in due[self.batch_size:]:
            row.waited_for_batch = True
        for row in due[:self.batch_size]:
            expect.claimed.append(row.id)
            until = self.participants[row.user].hold_until(now)
            if until is not None:
                expect.held[row.id] = until
            else:
                expect.dispatched.append(row.id)
        return expect

    def apply_poll(self, expect: PollExpectation) -> None:
        for row_id in expect.expired:
            self.rows[row_id].status = "expired"
        for row_id, until in expect.held.items():
            row = self.rows[row_id]
            row.not_before, row.holds = until, row.holds + 1
        for row_id in expect.dispatched:
            self.rows[row_id].status = "dispatched"

    def pending(self) -> list[LocalRow]:
        return [r for r in self.rows.values() if r.status == "pending"]
