"""The scheduler's phases as steps: a replica claims, dispatches one event, finishes or stops.

Each step hands one phase of the production ``Scheduler`` (``claim``, ``dispatch_next``,
``finish``) to the replica's thread; the named ``*_done`` method checks its result against
the model once it has finished (``settle``), and ``claim_blocked`` judges a wait.
"""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import Any

from harness.actors import Replica
from harness.faults import InjectedPollFault
from harness.types import RunContext
from scheduler.core.loop import Batch


def check_expiry(sim: RunContext, r: Replica, actual: list[str], actual_expired: list[str],
                 expected_expired: list[str]) -> None:
    """Nothing is dispatched after its expiry by the reference clock (SIM-EXPIRY): a claim
    takes no row past its expires_at for dispatch, and ends exactly the model's expired."""
    sim._check("SIM-EXPIRY")
    now = sim.now()
    for event_id in actual:
        row = sim.model.rows.get(event_id)
        if row is not None and row.status == "pending" and row.content.expired_at(now):
            raise sim.fail("SIM-EXPIRY", f"{r.name} claimed {event_id} to dispatch at {now:%H:%M}, after its "
                                         f"expires_at {row.content.expires_at:%H:%M}")
    if sorted(actual_expired) != sorted(expected_expired):
        raise sim.fail("SIM-EXPIRY", f"{r.name}'s claim ended {sim._show(actual_expired)} expired, but the rows "
                                     f"past their expiry it should end were {sim._show(expected_expired)}")


class Phases:
    """The claim, dispatch, finish and stop steps of one run."""

    def __init__(self, sim: RunContext) -> None:
        self.sim = sim
        # by replica: the reference time of its batch's first dispatch, when a batch decided
        # whole takes every decision and records every outcome's time (``core.strategies.SetBasedBatch``)
        self.decided_at: dict[int, datetime] = {}

    # -- claim ----------------------------------------------------------------------------

    def claim(self, replica: int) -> bool:
        """Replica ``replica`` opens a batch: it claims due pending rows (it may wait)."""
        sim = self.sim
        r = sim.replicas[replica]
        if r.op is not None or r.batch is not None or sim._a_claim_waits():
            return False
        sim._step("claim", f"sim.claim({replica})")
        armed = r.faults.armed == "claim"
        now = sim.now()
        expected, skipped, expired = ([], [], []) if armed else sim.model.expected_claim(replica, now, sim.batch_size)
        if not armed:
            sim.model.open_batch(replica, expected, skipped, expired, claimed_at=now)
        r.submit("claim", f"claim({replica})", r.scheduler.claim,
                 partial(self.claim_done, r, armed, expected, skipped, expired), partial(sim._claim_blocked, r))
        sim._after_step()
        return True

    def claim_done(self, r: Replica, armed: bool, expected: list[str], skipped: list[str], expired: list[str],
                   batch: Any, error: BaseException | None) -> None:
        sim = self.sim
        if error is not None:
            if r.killed or (armed and isinstance(error, InjectedPollFault)):
                sim._poll_failed(r)
                return
            if r.index in sim.model.batches:
                sim.model.discard(r.index)
            raise sim.fail("SIM-4", f"{r.name}'s claim raised {error!r}")
        r.batch = batch
        sim.clock_faults.check_not_early(r, [e.id for e in batch.events])
        sim.clock_faults.check_claim_time(r, batch.claimed_at)
        check_expiry(sim, r, [e.id for e in batch.events], [o.id for o in batch.expired], expired)
        self.check_claim(r, [e.id for e in batch.events], expected, list(batch.skipped), skipped)

    def check_claim(self, r: Replica, actual: list[str], expected: list[str],
                    actual_skipped: list[str] | None = None, expected_skipped: list[str] | None = None) -> None:
        """What a claim took: no busy participant's row (SIM-6), at most a batch (SIM-1), no row
        another batch holds (SIM-2), only pending rows (SIM-3), the due ones oldest first (SIM-1)."""
        sim = self.sim
        sim.clock_faults.check_not_early(r, actual)
        sim._check("SIM-6")
        busy = sim.model.busy_users(besides=r.index)
        for event_id in actual:
            row = sim.model.rows.get(event_id)
            if row is not None and row.content.user in busy:
                raise sim.fail("SIM-6", f"{r.name} claimed {event_id} of {row.content.user}, whose "
                                        "participant lock another batch holds: the cap would be counted unlocked")
        sim._check("SIM-1")
        if len(actual) > sim.batch_size:
            raise sim.fail("SIM-1", f"{r.name} claimed {len(actual)} rows, more than the batch size {sim.batch_size}")
        sim._check("SIM-2")
        held = sim.model.held(besides=r.index)
        for event_id in actual:
            if event_id in held:
                raise sim.fail("SIM-2", f"row {event_id} is claimed by {r.name} and replica {held[event_id]}")
        sim._check("SIM-3")
        for event_id in actual:
            row = sim.model.rows.get(event_id)
            if row is not None and row.status != "pending":
                raise sim.fail("SIM-3", f"{r.name} claimed {event_id}, which is {row.status}")
        if actual != expected:
            raise sim.fail("SIM-1", f"{r.name} claimed {sim._show(actual)} but the due pending rows, "
                                    f"oldest first, were {sim._show(expected)}")
        if actual_skipped is not None and actual_skipped != expected_skipped:
            raise sim.fail("SIM-1", f"{r.name} skipped {sim._show(actual_skipped)} as busy, but the rows "
                                    f"of participants other batches hold were {sim._show(expected_skipped or [])}")

    # -- dispatch -------------------------------------------------------------------------

    def dispatch(self, replica: int) -> bool:
        """Replica ``replica`` dispatches the next event of its batch, in its own savepoint."""
        sim = self.sim
        r = sim.replicas[replica]
        if r.op is not None or r.batch is None:
            return False
        sim._step("dispatch", f"sim.dispatch({replica})")
        batch = r.batch
        if batch.position == 0:
            self.decided_at[replica] = sim.now()
        expected = None if r.zombie else sim.model.next_expected(replica)
        r.submit("dispatch", f"dispatch({replica})", partial(r.scheduler.dispatch_next, batch),
                 partial(self.dispatch_done, r, batch, expected))
        sim._after_step()
        return True

    def dispatch_done(self, r: Replica, batch: Batch, expected: tuple[str, str] | None, outcome: Any,
                      error: BaseException | None) -> None:
        sim = self.sim
        # a batch decided whole at its first dispatch recorded every event's call: each waits for its own
        calls = [sim._call(r, c) for c in r.dispatcher.take_calls(expected[0] if expected else None)]
        if r.zombie or r.killed:
            if error is not None:
                sim._poll_failed(r)
            return
        if error is not None:
            sim._poll_failed(r)
            raise sim.fail("SIM-4", f"{r.name}: dispatch_next raised {error!r}: a failing event "
                                    "took its batch down")
        sim._check("SIM-4")
        if outcome is None:
            if expected is not None:
                raise sim.fail("SIM-1", f"{r.name} stopped before {expected[0]}")
            return
        self._check_dispatched(r, batch, expected, outcome, calls)

    def _check_dispatched(self, r: Replica, batch: Batch, expected: tuple[str, str] | None, outcome: Any,
                          calls: list[Any]) -> None:
        """One event's outcome against the model's next event, and its dispatcher calls."""
        sim, replica = self.sim, r.index
        if expected is None:
            raise sim.fail("SIM-1", f"{r.name} dispatched {outcome.id}, which it never claimed")
        event_id, status = expected
        # decided whole: at the reference time of the batch's first dispatch; else now
        sim.clock_faults.check_recorded_time(r, outcome, self.decided_at.get(replica) if batch.decided_whole else None)
        if outcome.id != event_id:
            raise sim.fail("SIM-1", f"{r.name} dispatched {outcome.id} before {event_id}")
        if outcome.status != status:
            raise sim.fail("SIM-4", f"{r.name}: {event_id} ended {outcome.status}, expected {status} "
                                    f"({outcome.error or 'no error'})")
        sim._check_expected(r, event_id, outcome.status, outcome.error)
        call = calls[-1] if calls else None
        sim._check("SIM-2")
        if call is None or call.event_id != event_id or call.version != sim.model.batches[replica].versions[event_id]:
            raise sim.fail("SIM-2", f"{r.name} dispatched other content than the row it locked: {call}")
        # A failing event rolls its batch back to the checkpoint: the events since it were
        # called again (their new calls replace the rolled-back ones) and so was this one.
        for earlier in calls[:-1]:
            sim.model.record_replay(replica, earlier, current=event_id)
        sim.model.record_outcome(replica, event_id, outcome.status, call)

    def _check_settled(self, r: Replica, batch: Batch, report: Any) -> None:
        """A batch decided whole at its first dispatch commits every event it decided, those
        not yet handed out by a dispatch step too (``core.strategies.SetBasedBatch``): each is checked as
        its dispatch would have been, in order."""
        sim = self.sim
        for outcome in report.outcomes[sim.model.batches[r.index].position:]:
            calls = [sim._call(r, c) for c in r.dispatcher.take_calls(outcome.id)]
            self._check_dispatched(r, batch, sim.model.next_expected(r.index), outcome, calls)

    # -- finish and stop ------------------------------------------------------------------

    def finish(self, replica: int) -> bool:
        """Replica ``replica`` commits its batch (events not dispatched stay pending, but for those
        a batch decided whole at its first dispatch: they commit with it)."""
        return self.end_batch(replica, "finish")

    def stop(self, replica: int) -> bool:
        """Stop replica ``replica`` while it holds a batch: the loop's stop path, then no locks."""
        r = self.sim.replicas[replica]
        if r.op is not None or r.batch is None or r.zombie:
            return False
        return self.end_batch(replica, "stop")

    def end_batch(self, replica: int, kind: str) -> bool:
        sim = self.sim
        r = sim.replicas[replica]
        if r.op is not None or r.batch is None:
            return False
        sim._step(kind, f"sim.{kind}({replica})")
        if kind == "stop":
            sim._fault("stop-holding-batch")
        batch: Batch = r.batch
        armed = r.faults.armed == "commit"
        r.submit(kind, f"{kind}({replica})", partial(r.scheduler.finish, batch),
                 partial(self.end_batch_done, r, batch, kind, armed))
        sim._after_step()
        return True

    def end_batch_done(self, r: Replica, batch: Batch, kind: str, armed: bool, report: Any,
                       error: BaseException | None) -> None:
        sim = self.sim
        r.batch = None
        if r.zombie or r.killed:
            if error is None:
                raise sim.fail("SIM-5", f"{r.name} committed a batch whose backend was killed")
            sim._poll_failed(r)
            return
        if error is not None:
            sim._poll_failed(r)
            if armed and isinstance(error, InjectedPollFault):
                return
            raise sim.fail("SIM-4", f"{r.name}: finishing the batch raised {error!r}")
        self._check_settled(r, batch, report)
        sim.model.commit(r.index)
        if kind == "stop":
            sim._check_stopped(r)
