"""The local-time scenario: participants in their own zones and quiet hours, a clock stepped
across a DST change, the production scheduler polling, and the invariants of specs/simulation.md
(SIM-LOCAL-*) checked after every step and after the drain.

A run is seeded: its world (``local_model.seeded_world``), every step and every row id come
from the seed, so ``scheduler simulate --scenario local-time --seed S`` replays it. Its steps:
a scheduled reminder posted (a trigger a little before or after now, sometimes an expiry,
sometimes a re-post by key), a live event (``application.ingest.dispatch_live``, deferred into
a scheduled row in quiet hours), and a tick: the clock moves forward by at most one poll
interval and one replica polls (``Scheduler.poll_once``, the variant's SQL on its connection).
Replicas poll one at a time; the replica simulation (``harness.simulation``) is where they race.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, text

from harness.assembly import NO_TIMEOUTS
from harness.faults import install_rewrites
from harness.local_model import (
    LocalModel,
    LocalRow,
    Participant,
    PollExpectation,
    local_variant,
    seeded_world,
)
from harness.types import Violation
from scheduler.application.ingest import dispatch_live
from scheduler.core import store
from scheduler.core.clock import ManualClock
from scheduler.database.database import Database
from scheduler.database.engine import make_engine
from scheduler.nudging.decision import NudgingPlatform
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.nudging.rules import load_catalogue
from scheduler.types import DigitalTwinEvent, DispatchOutcome, PollReport

TRUNCATE = text("TRUNCATE scheduler.scheduled_events, scheduler.notifications, scheduler.deliveries, "
                "scheduler.dedup_keys, scheduler.participant_preferences, scheduler.scheduled_event_history")
ROWS = text("SELECT id, user_id, status, trigger_at, not_before, expires_at, dispatched_at "
            "FROM scheduler.scheduled_events")
SENT = text("SELECT coalesce(scheduled_event_id, 'a live event') AS source, user_id, created_at "
            "FROM scheduler.notifications WHERE status = 'sent' ORDER BY created_at, id")


@dataclass
class LocalStats:
    steps: Counter[str] = field(default_factory=Counter)
    held: int = 0
    dispatched: int = 0
    expired: int = 0
    sent: int = 0
    live_deferred: int = 0


class LocalTimeSimulation:
    """One seeded run of the local-time scenario. Use as a context manager."""

    def __init__(self, database_url: str, *, seed: int = 0, participants: int = 7, replicas: int = 2,
                 scheduler: str = "correct", poll_minutes: int = 30, batch_size: int = 20,
                 live_expiry_minutes: int | None = 6 * 60,
                 world: tuple[datetime, str, list[Participant]] | None = None) -> None:
        """``world``: the start, the change it crosses and the participants, instead of the
        seed's (a directed test's); the steps still come from the seed."""
        if participants < 1 or replicas < 1 or poll_minutes < 1:
            raise ValueError("a local-time run needs a participant, a replica and a poll interval of a minute or more")
        self.url = database_url
        self.seed = seed
        self.rng = random.Random(seed)
        self.variant = local_variant(scheduler)
        self.interval = timedelta(minutes=poll_minutes)
        self.live_expiry = None if live_expiry_minutes is None else timedelta(minutes=live_expiry_minutes)
        self.start, self.crossing, people = seeded_world(self.rng, participants) if world is None else world
        self.participants = people
        self.model = LocalModel(people, batch_size)
        self.clock = ManualClock(self.start)
        self.program: list[str] = []
        self.stats = LocalStats()
        self.versions = 0
        self.engines: list[Engine] = []
        try:
            self.client = self._database(rewrites=False)
            with self.client.engine.begin() as conn:
                conn.execute(TRUNCATE)
            for p in people:
                store.set_preferences(self.client, p.user, enabled_kinds=None, max_per_day=p.cap, now=self.start,
                                      time_zone=p.zone_name, quiet_start=p.quiet.start if p.quiet else None,
                                      quiet_end=p.quiet.end if p.quiet else None)
            catalogue = load_catalogue()
            self.live_platform = NudgingPlatform(catalogue)
            self.replicas = [
                self.variant.scheduler_class(self._database(rewrites=True), NudgingPlatform(catalogue), self.clock,
                                             publisher=RecordingPublisher(), batch_size=batch_size,
                                             poll_seconds=self.interval.total_seconds(), name=f"replica-{i}")
                for i in range(replicas)
            ]
        except BaseException:
            self.close()
            raise

    def _database(self, *, rewrites: bool) -> Database:
        engine = make_engine(self.url, NO_TIMEOUTS, pool_size=1, max_overflow=0)
        self.engines.append(engine)
        if rewrites:
            install_rewrites(engine, self.variant.build_rewrites())
        return Database(engine)

    def __enter__(self) -> LocalTimeSimulation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for engine in self.engines:
            engine.dispose()
        self.engines = []

    def now(self) -> datetime:
        return self.clock.now()

    def fail(self, clause: str, message: str) -> Violation:
        return Violation(clause, f"{message} [{self.crossing}]", len(self.program))

    def _person(self, user: int) -> Participant:
        return self.participants[user % len(self.participants)]

    def _facts(self) -> dict[str, Any]:
        self.versions += 1
        # a date of its own per event: no two events share a deduplication key, so every
        # dispatch is a decision the cap and the quiet hours speak to
        scope = (self.start + timedelta(days=self.versions)).date().isoformat()
        return {"facts_version": "1", "scenario": "commitment_reminder", "date": scope,
                "commitment": f"task {self.versions}"}

    # -- the steps ------------------------------------------------------------------------------

    def post(self, user: int, trigger: int, window: int | None = None, key: str | None = None) -> None:
        """A reminder for participant ``user``, due ``trigger`` minutes from now, expiring
        ``window`` minutes after it (None: never), re-posting ``key``'s row when it names one."""
        self.program.append(f"sim.post({user}, {trigger}, {window}, {key!r})")
        self.stats.steps["post"] += 1
        person, now = self._person(user), self.now()
        trigger_at = now + timedelta(minutes=trigger)
        expires_at = None if window is None else trigger_at + timedelta(minutes=window)
        row_id = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        stored = store.store_event(self.client, event_type="reminder", user_id=person.user, community_id="c1",
                                   external_key=key, trigger_at=trigger_at, facts=self._facts(), now=now,
                                   event_id=row_id, expires_at=expires_at)
        self.model.post(str(stored["id"]), person.user, trigger_at, expires_at, key)
        self.check()

    def live(self, user: int) -> None:
        """A live event for participant ``user`` now: sent, or deferred into a scheduled row."""
        self.program.append(f"sim.live({user})")
        self.stats.steps["live"] += 1
        person, now = self._person(user), self.now()
        event = DigitalTwinEvent("reminder", person.user, "c1", self._facts())
        result = dispatch_live(self.client, self.live_platform, event, now, default_expiry=self.live_expiry)
        until = person.hold_until(now)
        deferred = result.outcome is DispatchOutcome.DEFERRED
        if deferred != (until is not None) or (deferred and result.not_before != until):
            # sent in quiet hours breaks SIM-LOCAL-1; held when it should not be, or until the
            # wrong instant, SIM-LOCAL-3
            clause = "SIM-LOCAL-1" if until is not None and not deferred else "SIM-LOCAL-3"
            raise self.fail(clause, f"a live event for {person.describe()} at {now:%Y-%m-%d %H:%M}Z was "
                                           f"{result.outcome.value} (not_before {result.not_before}); its quiet "
                                           f"hours {'hold it until ' + str(until) if until else 'do not hold it'}")
        if deferred and until is not None:
            self.stats.live_deferred += 1
            row_id = str((result.detail or {})["id"])
            expires = None if self.live_expiry is None else now + self.live_expiry
            self.model.deferred_live(row_id, person.user, now, until, expires)
        self.check()

    def tick(self, minutes: int, replica: int = 0) -> PollReport:
        """The clock moves ``minutes`` forward (at most one poll interval), then ``replica`` polls."""
        self.program.append(f"sim.tick({minutes}, {replica})")
        self.stats.steps["tick"] += 1
        if not 0 < minutes <= self.interval.total_seconds() / 60:
            raise ValueError(f"a tick moves the clock by 1 to {self.interval} minutes, not {minutes}")
        self.clock.advance(timedelta(minutes=minutes))
        expect = self.model.expect_poll(self.now())
        report = self.replicas[replica % len(self.replicas)].poll_once()
        self.check()  # what was sent first: a send in quiet hours or past the cap is what matters most
        self._check_poll(report, expect)
        self.model.apply_poll(expect)
        self.stats.held += len(expect.held)
        self.stats.dispatched += len(expect.dispatched)
        self.stats.expired += len(expect.expired)
        self.check_rows()
        return report

    def drain(self, *, max_ticks: int = 400) -> None:
        """Poll every interval until no row is pending, then check how each one ended (SIM-LOCAL-3)."""
        ticks = 0
        while self.model.pending():
            if ticks >= max_ticks:
                left = sorted((r.due_at, r.id) for r in self.model.pending())
                raise self.fail("SIM-LOCAL-3", f"rows still pending after {max_ticks} polls: {left[:5]}")
            self.tick(int(self.interval.total_seconds() // 60), ticks)
            ticks += 1
        self.check_endings()

    def run(self, steps: int) -> None:
        """``steps`` seeded steps, then the drain."""
        for _ in range(steps):
            roll = self.rng.random()
            user = self.rng.randrange(len(self.participants))
            if roll < 0.35:
                window = self.rng.choice((None, None, None, 20, 90, 8 * 60))
                self.post(user, self.rng.randrange(-60, 6 * 60), window)
            elif roll < 0.40:
                self.post(user, self.rng.randrange(-30, 3 * 60), None, key=f"k{self.rng.randrange(4)}")
            elif roll < 0.50:
                self.live(user)
            else:
                self.tick(1 + self.rng.randrange(int(self.interval.total_seconds() // 60)),
                          self.rng.randrange(len(self.replicas)))
        self.drain()

    # -- the invariants -------------------------------------------------------------------------

    def _sent(self) -> list[tuple[str, str, datetime]]:
        with self.engines[0].connect() as conn:
            return [(str(r.source), str(r.user_id), r.created_at) for r in conn.execute(SENT)]

    def _rows(self) -> dict[str, Any]:
        with self.engines[0].connect() as conn:
            return {str(r.id): r for r in conn.execute(ROWS)}

    def check(self) -> None:
        """SIM-LOCAL-1: nothing was sent inside its participant's quiet hours (in their zone, at
        the send); SIM-LOCAL-2: nobody got more than their cap in any of their local days."""
        people = {p.user: p for p in self.participants}
        per_day: Counter[tuple[str, Any]] = Counter()
        sent = self._sent()
        self.stats.sent = len(sent)
        for source, user, at in sent:
            person = people[user]
            if person.quiet_at(at):
                local = at.astimezone(person.zone)
                raise self.fail("SIM-LOCAL-1", f"a notification of {source} was sent to {person.describe()} at "
                                               f"{at:%Y-%m-%d %H:%M}Z ({local:%H:%M %Z} local), "
                                             "inside their quiet hours")
            per_day[(user, person.day_of(at))] += 1
        for (user, day), count in sorted(per_day.items()):
            person = people[user]
            if count > person.cap:
                raise self.fail("SIM-LOCAL-2", f"{person.describe()} got {count} notifications on their local day "
                                               f"{day}, more than their cap")

    def _check_poll(self, report: PollReport, expect: PollExpectation) -> None:
        """SIM-LOCAL-3: the poll claimed exactly the rows due (a held row not before its
        not_before), held again exactly those its participant's quiet hours hold, and ended
        expired exactly those past their expiry."""
        claimed = [o.id for o in report.outcomes]
        if sorted(claimed) != sorted(expect.claimed):
            early = sorted(set(claimed) - set(expect.claimed))
            shown = [f"{i[:8]} (due {self.model.rows[i].due_at:%Y-%m-%d %H:%M}Z)"
                     for i in early if i in self.model.rows]
            raise self.fail("SIM-LOCAL-3", f"the poll at {expect.now:%Y-%m-%d %H:%M}Z claimed {len(claimed)} rows, "
                                           f"the model {len(expect.claimed)}: not due yet {shown}, "
                                           f"due but left {sorted(set(expect.claimed) - set(claimed))}")
        held = {o.id: o.not_before for o in report.outcomes if o.status == "pending"}
        released = sorted(set(expect.held) - set(held))
        if released:
            row = self.model.rows[released[0]]
            person = self.model.participants[row.user]
            local = expect.now.astimezone(person.zone)
            raise self.fail("SIM-LOCAL-1", f"row {row.id} was dispatched at {expect.now:%Y-%m-%d %H:%M}Z "
                                           f"({local:%H:%M %Z} local) inside the quiet hours of {person.describe()}, "
                                           f"instead of held until {expect.held[row.id]:%Y-%m-%d %H:%M}Z")
        if held != expect.held:
            raise self.fail("SIM-LOCAL-3", f"the poll at {expect.now:%Y-%m-%d %H:%M}Z held {held}, the model "
                                           f"{expect.held}")
        expired = sorted(o.id for o in report.expired)
        if expired != sorted(expect.expired):
            raise self.fail("SIM-LOCAL-3", f"the poll at {expect.now:%Y-%m-%d %H:%M}Z ended expired {expired}, "
                                           f"the model {sorted(expect.expired)}")

    def check_rows(self) -> None:
        """SIM-LOCAL-3: every row is as the model says: its status and its not_before."""
        db = self._rows()
        if set(db) != set(self.model.rows):
            raise self.fail("SIM-LOCAL-3", "rows differ from the model's: "
                                           f"extra {sorted(set(db) - set(self.model.rows))}, "
                                           f"missing {sorted(set(self.model.rows) - set(db))}")
        for row_id, row in self.model.rows.items():
            got = db[row_id]
            if (got.status, got.not_before) != (row.status, row.not_before):
                raise self.fail("SIM-LOCAL-3", f"row {row_id} is {got.status} (not_before {got.not_before}) but "
                                               f"{row.status} (not_before {row.not_before}) in the model")

    def check_endings(self) -> None:
        """SIM-LOCAL-3 after the drain: every row ended dispatched or expired; a held row
        dispatched within one poll interval of its not_before (unless a full batch came first)."""
        db = self._rows()
        for row_id, row in self.model.rows.items():
            got = db[row_id]
            if got.status not in ("dispatched", "expired"):
                raise self.fail("SIM-LOCAL-3", f"row {row_id} ended {got.status}")
            if got.status == "dispatched" and got.not_before is not None and not self._in_time(row, got.dispatched_at):
                raise self.fail("SIM-LOCAL-3", f"held row {row_id} was dispatched at "
                                               f"{got.dispatched_at:%Y-%m-%d %H:%M}Z, not within {self.interval} "
                                               f"of its not_before {got.not_before:%Y-%m-%d %H:%M}Z")

    def _in_time(self, row: LocalRow, dispatched_at: datetime) -> bool:
        due = row.due_at
        return row.waited_for_batch or due <= dispatched_at < due + self.interval

    def summary(self) -> dict[str, Any]:
        return {
            "scenario": "local-time", "seed": self.seed, "scheduler": self.variant.name,
            "start": self.start.isoformat(), "crossing": self.crossing, "end": self.now().isoformat(),
            "participants": [p.describe() for p in self.participants],
            "steps": dict(self.stats.steps), "steps_total": len(self.program), "rows": len(self.model.rows),
            "holds": self.stats.held, "live_deferred": self.stats.live_deferred,
            "dispatched": self.stats.dispatched, "expired": self.stats.expired, "sent": self.stats.sent,
        }
