"""Each replica's clocks: its host's wall clock (skewed by a fault) and the clock its
scheduler reads, which in production is the database's (``DatabaseClock``, DEC-10).

The simulation's one ``ManualClock`` plays the database server's clock: the reference.
A replica's host clock is that reference shifted by the replica's offset (``skew_clock``,
a host whose time is wrong or was stepped). The production scheduler measures the
reference (``DatabaseClock`` reading it, anchored to a monotonic clock that runs with it)
and so claims and records by it whatever its host says; the broken variant ``host-clock``
reads its host clock instead and is caught by SIM-10.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from harness.types import RunContext
from scheduler.core.clock import DatabaseClock, ManualClock, OffsetClock
from scheduler.core.loop import EventOutcome
from scheduler.types import Clock

if TYPE_CHECKING:
    from harness.actors import Replica

_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def reference_monotonic(reference: ManualClock) -> float:
    """A monotonic clock that runs with the reference (the simulation's time is frozen
    between steps, so the host's real monotonic clock would not move at all)."""
    return (reference.now() - _EPOCH).total_seconds()


def scheduler_clock(reference: ManualClock, host: OffsetClock, *, trusts_host: bool) -> Clock:
    """The clock a replica's scheduler reads: production's, measured against the reference
    (taking its first reading now), or, for the broken variant, the host's own."""
    if trusts_host:
        return host
    clock = DatabaseClock(reference.now, host=host, monotonic=lambda: reference_monotonic(reference))
    clock.sync()
    return clock


class ClockFaults:
    """The ``skew_clock`` step and the SIM-10 checks of one run (``types.ClockChecks``);
    ``reference`` is the run's one clock, which stands for the database server's."""

    def __init__(self, sim: RunContext, reference: ManualClock) -> None:
        self.sim = sim
        self.reference = reference
        self.hosts: dict[int, OffsetClock] = {}

    def host(self, replica: int) -> OffsetClock:
        """Replica ``replica``'s host wall clock (correct until a skew step shifts it)."""
        if replica not in self.hosts:
            self.hosts[replica] = OffsetClock(self.reference)
        return self.hosts[replica]

    def skew_clock(self, replica: int, minutes: int) -> bool:
        """Replica ``replica``'s host clock is set ``minutes`` off the reference (0: right again)."""
        sim = self.sim
        r = sim.replicas[replica]
        if r.op is not None:
            return False
        sim._step("skew_clock", f"sim.skew_clock({replica}, {minutes})")
        sim._fault("clock-skew")
        self.host(replica).offset = timedelta(minutes=minutes)
        clock = r.scheduler.clock
        if isinstance(clock, DatabaseClock):
            clock.sync()  # as production measures again every few seconds
        sim._after_step()
        return True

    def check_not_early(self, r: Replica, event_ids: list[str]) -> None:
        """SIM-10: no row is claimed (to be dispatched) before its trigger by the reference."""
        sim = self.sim
        sim._check("SIM-10")
        now = sim.now()
        for event_id in event_ids:
            row = sim.model.rows.get(event_id)
            if row is not None and row.content.trigger_at > now:
                offset = self.host(r.index).offset
                raise sim.fail("SIM-10", f"{r.name} took {event_id} due {row.content.trigger_at:%d %H:%M} at "
                                        f"{now:%d %H:%M} by the reference clock, before its trigger "
                                        f"(its host clock is {offset} off)")

    def check_claim_time(self, r: Replica, claimed_at: datetime | None) -> None:
        """SIM-10: a claim judges "due" by the reference clock: not early (a row before its
        trigger), not late (a due row left pending because the host's clock is behind)."""
        sim = self.sim
        sim._check("SIM-10")
        if claimed_at is not None and claimed_at != sim.now():
            raise sim.fail("SIM-10", f"{r.name} claimed by the time {claimed_at:%d %H:%M}, not the reference "
                                    f"clock's {sim.now():%d %H:%M}: rows leave before their trigger or stay late")

    def check_recorded_time(self, r: Replica, outcome: EventOutcome, at: datetime | None = None) -> None:
        """SIM-10: the time recorded for an outcome (dispatched_at, updated_at) is the reference's:
        now, or ``at`` (the reference's time when the outcome was decided, ahead of its dispatch)."""
        sim = self.sim
        sim._check("SIM-10")
        expected = sim.now() if at is None else at
        if outcome.finished_at is not None and outcome.finished_at != expected:
            raise sim.fail("SIM-10", f"{r.name} recorded {outcome.id} at {outcome.finished_at:%d %H:%M}, "
                                    f"not the reference clock's {expected:%d %H:%M}")
