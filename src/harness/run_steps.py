"""The ``run`` step: a replica runs the production loop (``Scheduler.run_blocking``).

Unlike the phase steps (claim, dispatch, finish), this one hands the whole poll to the
production loop and checks the outcome afterwards. Each run is one object whose methods
are the callbacks the loop and the actor thread call: ``on_call`` (after each dispatcher
call: the "stop after k events" budget), ``loop`` (the actor thread's work), ``done``
(the result, checked against the model), ``blocked`` (a wait seen in ``pg_locks``), and,
in prompt mode, ``after_poll`` (the loop's poll hook, which ends the step).
"""

from __future__ import annotations

import threading
from typing import Any

from harness.actors import Replica
from harness.faults import PollBudget
from harness.model import Call, cut_by_stop
from harness.phases import check_expiry
from harness.types import RunContext
from scheduler.core.loop import PollReport, Scheduler

# A prompt-mode run step lets the loop poll again at once after a full batch, at most this
# many polls; it ends with the first short batch (where the loop would start to wait).
PROMPT_RUN_POLLS = 3


class _Run:
    """What both modes' run steps share: the replica, its armed fault, the "stop after k
    events" budget (``on_call``) and how a loop that died or was killed ends the step."""

    stop: threading.Event

    def __init__(self, sim: RunContext, r: Replica, stop_after: int | None) -> None:
        self.sim = sim
        self.r = r
        self.stop_after = stop_after
        self.armed = r.faults.armed
        self.health = r.scheduler.health
        self.polls_before = self.health.polls

    def on_call(self) -> None:
        # Events, not calls: a failing event makes the loop call the events before it again.
        counted = len({c["event_id"] for c in self.r.dispatcher.calls})
        if self.stop_after is not None and counted >= self.stop_after:
            self.stop.set()

    def cut(self, final_calls: list[Call], events_called: int) -> set[str]:
        """The events the run's stop left pending (``model.cut_by_stop``): only when the stop
        was asked during the last event's call (``events_called`` reached the budget) and the
        dispatcher runs its batches optimistically, event by event (the replay the stop cut
        short: DEC-1, DEC-1.4, DEC-1.5)."""
        if self.stop_after is None or events_called < self.stop_after or not self.r.dispatcher.replays_on_failure:
            return set()
        return cut_by_stop(final_calls)

    def ended_by_fault(self, error: BaseException | None) -> bool:
        """True when the step ends here: the replica's backend was killed (the loop must
        have survived it). A loop that raised is a SIM-4 violation."""
        sim, r = self.sim, self.r
        if error is not None:
            sim._poll_failed(r)
            raise sim.fail("SIM-4", f"{r.name}: the loop itself died: {error!r}")
        if r.killed:
            sim._poll_failed(r)
            sim._check_loop_survived(r, "")
            return True
        sim._check("SIM-4")
        return False


class LiteralRun(_Run):
    """One poll of a literal-mode loop (two when the first is armed to fail at its claim),
    stopped after ``stop_after`` events."""

    def __init__(self, sim: RunContext, r: Replica, stop_after: int | None) -> None:
        super().__init__(sim, r, stop_after)
        now = sim.now()
        self.expected, self.skipped, self.expired = sim.model.expected_claim(r.index, now, sim.batch_size)
        sim.model.open_batch(r.index, self.expected, self.skipped, self.expired, claimed_at=now)
        self.limit = len(self.expected) if stop_after is None else min(stop_after, len(self.expected))
        self.stop = PollBudget(2 if self.armed == "claim" else 1)
        if stop_after is not None and stop_after < len(self.expected):
            sim._fault("stop-mid-batch")

    def loop(self) -> None:
        self.r.dispatcher.on_call = self.on_call
        try:
            self.r.scheduler.run_blocking(self.stop)
        finally:
            self.r.dispatcher.on_call = None

    def done(self, _: Any, error: BaseException | None) -> None:
        sim, r, replica, health = self.sim, self.r, self.r.index, self.health
        calls = sim.model.last_calls([sim._call(r, c) for c in r.dispatcher.take_calls()])
        if self.ended_by_fault(error):
            return
        committed = health.polls - self.polls_before
        for call in calls:
            sim.model.batches[replica].calls.append(call)
        if self.armed == "commit":
            sim.stats.poll_errors += 1
            sim.model.discard(replica)
            if committed != 0:
                raise sim.fail("SIM-5", f"{r.name} committed a poll whose commit failed")
            sim._check_loop_survived(r, "InjectedPollFault")
            return
        if committed != 1:
            sim.model.discard(replica)
            raise sim.fail("SIM-4", f"{r.name}'s poll rolled back ({health.last_error}): "
                                    "one failing event took the batch down")
        if self.armed == "claim":
            sim.stats.poll_errors += 1
            sim._check_loop_survived(r, "InjectedPollFault")
        dispatched = [c.event_id for c in calls]
        report = r.scheduler.last_report
        sim.clock_faults.check_not_early(r, dispatched)
        sim.clock_faults.check_claim_time(r, r.scheduler.last_claimed_at)
        for outcome in report.outcomes if report is not None else ():
            sim.clock_faults.check_recorded_time(r, outcome)
        if report is not None and report.skipped != len(self.skipped):
            sim.model.discard(replica)
            raise sim.fail("SIM-1", f"{r.name}'s loop skipped {report.skipped} rows as busy, "
                                    f"expected {sim._show(self.skipped)}")
        if report is not None:
            check_expiry(sim, r, dispatched, [o.id for o in report.expired], self.expired)
        if dispatched != self.expected[:self.limit]:
            sim.model.discard(replica)
            raise sim.fail("SIM-1", f"{r.name}'s loop dispatched {sim._show(dispatched)}, "
                                    f"expected {sim._show(self.expected[:self.limit])}")
        try:
            for outcome in report.outcomes if report is not None else ():
                sim._check_expected(r, outcome.id, outcome.status, outcome.error)
        except Exception:
            sim.model.discard(replica)
            raise
        batch = sim.model.batches[replica]
        batch.calls.clear()
        cut = self.cut(calls, len(calls))
        for call in calls:
            if call.event_id in cut:
                sim.model.discarded_calls.append(call)  # rolled back with the checkpoint: pending again
                continue
            sim.model.record_outcome(replica, call.event_id,
                                     "dispatched" if call.result == "ok" else "failed", call)
        sim.model.commit(replica)
        if self.stop_after is not None:
            sim._check_stopped(r)

    def blocked(self, lock: str) -> None:
        # Only the claim is checked here: once events are being dispatched, a wait (possible
        # only when participants are not locked) is left to play out for SIM-6 to judge.
        if not self.r.dispatcher.calls:
            self.sim._claim_blocked(self.r, lock)


class PromptRun(_Run):
    """A prompt-mode loop: it polls again at once after each full batch (at most
    ``PROMPT_RUN_POLLS`` polls) and the step ends with the first short one, where the loop
    would start to wait. ``after_poll`` (a poll hook) ends the loop there; an armed claim
    fault fails the first poll and a wake-up makes the loop poll again at once."""

    def __init__(self, sim: RunContext, r: Replica, stop_after: int | None) -> None:
        super().__init__(sim, r, stop_after)
        now = sim.now()
        first, first_skipped, first_expired = ([], [], []) if self.armed == "claim" else \
            sim.model.expected_claim(r.index, now, sim.batch_size)
        sim.model.open_batch(r.index, first, first_skipped, first_expired, claimed_at=now)
        self.stop = threading.Event()
        self.failures = 0
        self.reports: list[PollReport] = []
        if stop_after is not None:
            sim._fault("stop-mid-batch")

    def after_poll(self, scheduler: Scheduler) -> None:
        if self.health.consecutive_failures:
            self.failures += 1
            if self.armed == "claim" and not self.reports and self.failures == 1:
                scheduler.announce(None)  # the loop would wait; look again at once instead
            else:
                self.stop.set()
            return
        report = scheduler.last_report
        assert report is not None
        self.reports.append(report)
        if report.claimed < self.sim.batch_size or len(self.reports) >= PROMPT_RUN_POLLS:
            self.stop.set()

    def loop(self) -> None:
        self.r.dispatcher.on_call = self.on_call
        self.r.scheduler.poll_hooks.append(self.after_poll)
        try:
            self.r.scheduler.run_blocking(self.stop)
        finally:
            self.r.scheduler.poll_hooks.remove(self.after_poll)
            self.r.dispatcher.on_call = None

    def done(self, _: Any, error: BaseException | None) -> None:
        sim, r, replica = self.sim, self.r, self.r.index
        calls = [sim._call(r, c) for c in r.dispatcher.take_calls()]
        if self.ended_by_fault(error):
            return
        if self.armed == "commit":
            sim.stats.poll_errors += 1
            sim.model.discard(replica)
            if self.health.polls != self.polls_before:
                raise sim.fail("SIM-5", f"{r.name} committed a poll whose commit failed")
            sim._check_loop_survived(r, "InjectedPollFault")
            return
        if self.armed == "claim":
            sim.stats.poll_errors += 1
            sim._check_loop_survived(r, "InjectedPollFault")
            sim.model.discard(replica)
        self.check_polls(calls, reopen=self.armed == "claim")
        if self.stop_after is not None:
            sim._check_stopped(r)

    def blocked(self, lock: str) -> None:
        self.sim._claim_blocked(self.r, lock)

    def check_polls(self, calls: list[Call], reopen: bool) -> None:
        """Check the run poll by poll against the model: each poll's claim, its batch bound,
        its skipped rows and its calls; and that the loop polled again exactly after each
        full batch."""
        sim, r, replica = self.sim, self.r, self.r.index
        sim._check("SIM-1")
        budget = self.stop_after
        position = 0
        for report in self.reports:
            sim.clock_faults.check_not_early(r, [o.id for o in report.outcomes])
        if self.reports:
            sim.clock_faults.check_claim_time(r, r.scheduler.last_claimed_at)
            for outcome in report.outcomes:
                sim.clock_faults.check_recorded_time(r, outcome)
        for number, report in enumerate(self.reports):
            if report.claimed > sim.batch_size:
                if replica in sim.model.batches:
                    sim.model.discard(replica)
                raise sim.fail("SIM-1", f"{r.name}'s prompt-mode poll {number + 1} claimed {report.claimed} rows, "
                                        f"more than the batch size {sim.batch_size}")
            if number > 0 or reopen:
                now = sim.now()
                expected, skipped, expired = sim.model.expected_claim(replica, now, sim.batch_size)
                sim.model.open_batch(replica, expected, skipped, expired, claimed_at=now)
            batch = sim.model.batches[replica]
            expected, skipped = batch.ids, batch.skipped
            check_expiry(sim, r, [o.id for o in report.outcomes], [o.id for o in report.expired], batch.expired)
            take = len(expected) if budget is None else min(budget, len(expected))
            # this poll's calls: its events are its own (a row is terminal once committed),
            # and replays after a failure repeat them; the final call of each one counts
            end = position
            while end < len(calls) and calls[end].event_id in expected:
                end += 1
            mine = sim.model.last_calls(calls[position:end])
            position = end
            if [c.event_id for c in mine] != expected[:take] or report.skipped != len(skipped):
                sim.model.discard(replica)
                raise sim.fail("SIM-1", f"{r.name}'s prompt-mode poll {number + 1} dispatched "
                                        f"{sim._show([c.event_id for c in mine])} (skipping {report.skipped}), "
                                        f"expected {sim._show(expected[:take])} (skipping {len(skipped)})")
            try:
                for outcome in report.outcomes:
                    sim._check_expected(r, outcome.id, outcome.status, outcome.error)
            except Exception:
                sim.model.discard(replica)
                raise
            last = number == len(self.reports) - 1
            cut = self.cut(mine, len({c.event_id for c in calls})) if last else set()
            for call in mine:
                if call.event_id in cut:
                    sim.model.discarded_calls.append(call)  # rolled back with the checkpoint: pending again
                    continue
                sim.model.record_outcome(replica, call.event_id,
                                         "dispatched" if call.result == "ok" else "failed", call)
            sim.model.commit(replica)
            if budget is not None:
                budget -= take
            full = len(expected) >= sim.batch_size or len(batch.expired) >= sim.batch_size
            again = full and (budget is None or budget > 0) and number + 1 < PROMPT_RUN_POLLS
            polled_again = number + 1 < len(self.reports)
            if again != polled_again:
                raise sim.fail("SIM-1", f"{r.name} in prompt mode {'polled again' if polled_again else 'waited'} "
                                        f"after a {'full' if full else 'short'} batch")
        if not self.reports and replica in sim.model.batches:
            sim.model.discard(replica)
        if position != len(calls):
            raise sim.fail("SIM-1", f"{r.name} made {len(calls) - position} dispatcher calls no poll accounts for")
