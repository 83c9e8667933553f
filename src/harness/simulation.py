"""``Simulation``: several production schedulers, one PostgreSQL, one frozen clock.

Every step is an explicit method (``post``, ``claim(r)``, ``dispatch(r)``, ``crash(r)``...),
so interleavings are produced, not hoped for. After each step the simulation waits until
every actor has either finished or is seen waiting on a lock in ``pg_locks``, then compares
the database with the model (``model.py``) through a separate observer connection. A
mismatch raises ``Violation`` naming the invariant (``SIM-n`` in specs/simulation.md).

This module is a run, its step API and its bookkeeping. What a run is made of is
``assembly.py``; which actors are free for which step, ``choices.py`` (mixed in); a host's
expectation of its events, ``expectations.py``; the steps themselves, ``posts.py``,
``phases.py``, ``run_steps.py``, ``replica_faults.py`` and ``clocks.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from harness.actors import Actor, Client, Replica, Stats
from harness.assembly import new_client, new_replica, set_preferences, set_up_host
from harness.broken import variant
from harness.choices import StepChoices
from harness.clocks import ClockFaults, scheduler_clock
from harness.expectations import HostExpectations
from harness.host import BUILTIN_FAULTS, HOST_FAULTS, Expected, HostDispatcher, host_of
from harness.model import Call, Model
from harness.observer import Observer
from harness.oracle import Oracle
from harness.phases import Phases
from harness.posts import Posts
from harness.probe import RollbackProbe
from harness.replica_faults import ReplicaFaults
from harness.run_steps import LiteralRun, PromptRun
from harness.settle import Settler
from harness.teardown import close_run
from harness.types import Violation
from scheduler.core.clock import ManualClock
from scheduler.core.loop import Scheduler
from scheduler.nudging.dispatch import NudgingPlatform
from scheduler.nudging.publishers import RecordingPublisher
from scheduler.nudging.rules import load_catalogue
from scheduler.types import DigitalTwinEvent, Dispatcher, SchedulerMode

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
# How the replicas' loops pace their polls (DEC-9): every replica literal, every replica
# prompt, or mixed (odd replicas prompt).
MODES = ("literal", "prompt", "mixed")


def _minutes(n: int) -> timedelta:
    return timedelta(minutes=n)


class Simulation(StepChoices):
    """One run. Use as a context manager; ``close()`` ends every connection and thread.

    The replicas dispatch through the built-in platform (``NudgingPlatform``) unless given a
    host's: ``dispatcher_factory`` (called once per replica) or a whole ``host``
    (``harness.HostDispatcher``: the factory, the host's table setup, its expectation of an
    event and its effects check). With a host, SIM-6 (the built-in platform's deduplication,
    cap and preferences) is not checked and the ``refused`` fault is not posted.
    """

    def __init__(
        self,
        database_url: str,
        *,
        seed: int = 0,
        replicas: int = 2,
        clients: int = 2,
        batch_size: int = 20,
        participants: int = 3,
        scheduler: str = "correct",
        clean: bool = True,
        check_every_step: bool = True,
        start: datetime = T0,
        modes: str = "literal",
        dispatcher_factory: Callable[[], Dispatcher] | None = None,
        host: HostDispatcher | None = None,
    ) -> None:
        if replicas < 1 or clients < 1 or participants < 1:
            raise ValueError("a simulation needs at least one replica, client and participant")
        if modes not in MODES:
            raise ValueError(f"modes is one of {', '.join(MODES)}, not {modes!r}")
        self.modes = modes
        self.host = host_of(dispatcher_factory, host)
        self.event_faults: tuple[str, ...] = BUILTIN_FAULTS if self.host is None else HOST_FAULTS
        self.url = database_url
        self.seed = seed
        self.batch_size = batch_size
        self.variant = variant(scheduler)
        self.rewrites = self.variant.build_rewrites()  # fails here if its target SQL is gone
        if self.variant.modes is not None:
            self.modes = self.variant.modes
        self.check_every_step = check_every_step
        self.start = start
        self.stats = Stats()
        self.program: list[str] = []
        self.step_no = 0
        self.violation: Violation | None = None
        self.versions = 0
        self.observer = Observer(database_url)
        self.settler = Settler(lambda: self.actors, self.observer, self.stats)
        self.oracle = Oracle(self)
        self.posts = Posts(self)
        self.phases = Phases(self)
        self.replica_faults = ReplicaFaults(self)
        if clean:
            self.observer.truncate()
        self.caps = {f"p{i}": 1 + i % 3 for i in range(participants)}
        self.participants = participants
        self.model = Model(self.caps)
        self.expectations = HostExpectations(self.host, self.model, self.fail, self._check)
        self.clock = ManualClock(start)
        self.clock_faults = ClockFaults(self, self.clock)
        self.catalogue = load_catalogue()
        self.replicas: list[Replica] = []
        self.clients: list[Client] = []
        self.probe: RollbackProbe | None = None
        try:  # the run's pieces (assembly.py)
            if self.host is None:
                set_preferences(database_url, self.caps, start)
            elif self.host.setup is not None:
                set_up_host(database_url, self.host.setup)
            for i in range(replicas):
                inner: Dispatcher = NudgingPlatform(self.catalogue) if self.host is None else self.host.factory()
                self.replicas.append(new_replica(database_url, i, self.rewrites, inner, self._make_scheduler))
            for i in range(clients):
                self.clients.append(new_client(database_url, i))
            self.probe = None if self.host is None else RollbackProbe(database_url)  # SIM-HOST-8
            if self.probe is not None:
                self.probe.watch(r.engine for r in self.replicas)
                for r in self.replicas:
                    r.dispatcher.probe = self.probe
        except BaseException:
            self.close()
            raise

    def _make_scheduler(self, replica: Replica) -> Scheduler:
        """A replica's production scheduler (again after each crash), of the run's variant."""
        clock = scheduler_clock(self.clock, self.clock_faults.host(replica.index),
                                trusts_host=self.variant.trusts_host_clock)
        return self.variant.scheduler_class(
            replica.database, replica.dispatcher, clock,
            publisher=RecordingPublisher(), batch_size=self.batch_size,
            poll_seconds=30.0, name=replica.name, mode=self.mode_of(replica.index),
        )

    def mode_of(self, replica: int) -> SchedulerMode:
        """The replica's loop mode: all literal, all prompt, or mixed (odd replicas prompt)."""
        if self.modes == "mixed":
            return SchedulerMode.PROMPT if replica % 2 else SchedulerMode.LITERAL
        return SchedulerMode(self.modes)

    def __enter__(self) -> Simulation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def actors(self) -> list[Actor]:
        return [*self.replicas, *self.clients]

    # -- what steps are possible now: ``StepChoices`` (choices.py) ---------------------------

    def now(self) -> datetime:
        return self.clock.now()

    # -- a host's dispatcher (harness.host; its expectation: expectations.py) ----------------

    def expect(self, event: DigitalTwinEvent) -> Expected | None:
        """What the host expects of ``event`` (None: the built-in platform, or no opinion)."""
        return self.expectations.expect(event)

    def _check_expected(self, r: Replica, event_id: str, status: str, error: str | None) -> None:
        """SIM-4, for a host's dispatcher: the event ended as the host (and its fault) said."""
        self.expectations.check(r, event_id, status, error)

    # -- bookkeeping ------------------------------------------------------------------------

    def _step(self, kind: str, code: str) -> None:
        if self.violation is not None:
            raise RuntimeError("the simulation already failed; replay it from its program")
        self.step_no += 1
        self.program.append(code)
        Stats.bump(self.stats.steps, kind)

    def _fault(self, kind: str) -> None:
        Stats.bump(self.stats.faults, kind)

    def _check(self, clause: str) -> None:
        Stats.bump(self.stats.checks, clause)

    def fail(self, clause: str, message: str) -> Violation:
        violation = Violation(clause, message, self.step_no)
        if self.violation is None:
            self.violation = violation
        return violation

    def _after_step(self) -> None:
        try:
            self._settle()
            if self.check_every_step:
                self.check()
        except Violation as violation:
            if self.violation is None:
                self.violation = violation
            raise

    # -- posts (the API side; posts.py) -----------------------------------------------------

    def begin_post(self, client: int, user: int, trigger: int, key: str | None = None,
                   day: int = 0, fault: str | None = None, window: int | None = None) -> bool:
        """A post arrives at API client ``client`` (trigger in minutes from now, day of the facts,
        ``window``: its expires_at in minutes after the trigger, EXP-1)."""
        return self.posts.begin_post(client, user, trigger, key, day, fault, window)

    def end_post(self, client: int) -> bool:
        """The API answers client ``client``'s post: the store writes and commits (it may wait)."""
        return self.posts.end_post(client)

    def post(self, user: int, trigger: int, key: str | None = None, day: int = 0,
             fault: str | None = None, window: int | None = None) -> bool:
        """A post that arrives and is answered at once, on the first free client."""
        return self.posts.post(user, trigger, key, day, fault, window)

    def reset(self, row: int) -> bool:
        """The operator resets the ``row``-th stored row (modulo the count) by hand."""
        return self.posts.reset(row)

    def cancel(self, row: int) -> bool:
        """A sender cancels the ``row``-th stored row (modulo the count); it may race a dispatch."""
        return self.posts.cancel(row)

    # -- the clock --------------------------------------------------------------------------

    def advance(self, minutes: int) -> bool:
        """Move the shared clock; negative jumps backwards."""
        self._step("advance", f"sim.advance({minutes})")
        if minutes < 0:
            self._fault("clock-backwards")
        elif minutes >= 24 * 60:
            self._fault("clock-forwards")
        self.clock.advance(_minutes(minutes))
        self._after_step()
        return True

    # -- the scheduler's phases (phases.py, run_steps.py) ----------------------------------

    def claim(self, replica: int) -> bool:
        """Replica ``replica`` opens a batch: it claims due pending rows (it may wait)."""
        return self.phases.claim(replica)

    def dispatch(self, replica: int) -> bool:
        """Replica ``replica`` dispatches the next event of its batch, in its own savepoint."""
        return self.phases.dispatch(replica)

    def finish(self, replica: int) -> bool:
        """Replica ``replica`` commits its batch (events not dispatched stay pending)."""
        return self.phases.finish(replica)

    def stop(self, replica: int) -> bool:
        """Stop replica ``replica`` while it holds a batch: the loop's stop path, then no locks."""
        return self.phases.stop(replica)

    # helpers the phase and run steps share

    def _claim_blocked(self, r: Replica, lock: str) -> None:
        self._check("SIM-1")
        if lock != "advisory":
            raise self.fail("SIM-1", f"{r.name}'s claim waits on a {lock} lock: a row another replica "
                                     "holds, which it must skip")
        raise self.fail("SIM-1", f"{r.name}'s claim waits on a participant lock: a claim only "
                                 "try-locks participants and skips busy ones (DEC-2)")

    def _show(self, ids: list[str]) -> str:
        shown = []
        for event_id in ids:
            row = self.model.rows.get(event_id)
            when = row.content.trigger_at.strftime("%d %H:%M") if row else "?"
            shown.append(f"{event_id[:8]}@{when}")
        return "[" + ", ".join(shown) + "]"

    def _poll_failed(self, r: Replica) -> None:
        """What the loop does when a poll raises: roll the batch back and carry on."""
        self.stats.poll_errors += 1
        if r.batch is not None:
            with contextlib.suppress(Exception):
                r.scheduler.abort(r.batch)
        r.batch = None
        r.zombie = False
        r.killed = False
        if r.index in self.model.batches:
            self.model.discard(r.index)
        r.dispatcher.take_calls()
        self.replica_faults.check_nothing_published(r)

    def _call(self, r: Replica, raw: dict[str, Any]) -> Call:
        serial = self.model.batches[r.index].serial if r.index in self.model.batches else 0
        return Call(r.index, str(raw["event_id"]), int(raw["version"]), str(raw["result"]),
                    raw["outcome"], tuple(raw["notification_ids"]), serial)

    def _check_stopped(self, r: Replica) -> None:
        self._check("SIM-7")
        if r.pid is None:
            return
        held = self.observer.held_locks([r.pid]).get(r.pid)
        state = self.observer.states([r.pid]).get(r.pid)
        if held or state == "idle in transaction":
            raise self.fail("SIM-7", f"{r.name} has stopped but its backend is {state} holding {held}")

    def run(self, replica: int, stop_after: int | None = None) -> bool:
        """Replica ``replica`` runs the production loop (``run_blocking``): in literal mode one
        poll, stopped after ``stop_after`` events (two polls if its next poll is armed to
        fail); in prompt mode, polls until the first short batch (see ``run_steps``)."""
        r = self.replicas[replica]
        if r.op is not None or r.batch is not None or self._a_claim_waits():
            return False
        self._step("run", f"sim.run({replica}, stop_after={stop_after})")
        prompt = r.scheduler.mode is SchedulerMode.PROMPT
        step = PromptRun(self, r, stop_after) if prompt else LiteralRun(self, r, stop_after)
        r.submit("run", f"run({replica})", step.loop, step.done, step.blocked)
        self._after_step()
        return True

    def _check_loop_survived(self, r: Replica, needle: str) -> None:
        self._check("SIM-4")
        error = r.scheduler.health.last_error
        if error is None or needle not in error:
            raise self.fail("SIM-4", f"{r.name}'s loop did not record the failed poll (last_error={error!r})")

    # -- faults to replicas (replica_faults.py) ---------------------------------------------

    def fail_next_poll(self, replica: int, where: str = "claim") -> bool:
        """Arm replica ``replica`` so that its next poll raises outside any event."""
        return self.replica_faults.fail_next_poll(replica, where)

    def crash(self, replica: int) -> bool:
        """Replica ``replica``'s process dies mid-batch: its connection closes without commit."""
        return self.replica_faults.crash(replica)

    def kill(self, replica: int) -> bool:
        """``pg_terminate_backend`` on replica ``replica``'s backend, from the observer's session."""
        return self.replica_faults.kill(replica)

    def freeze(self, replica: int) -> bool:
        """Replica ``replica`` freezes mid-batch past the idle-in-transaction timeout: the
        database ends its session while the replica still runs (it resumes later)."""
        return self.replica_faults.freeze(replica)

    def skew_clock(self, replica: int, minutes: int) -> bool:
        """Replica ``replica``'s host clock goes ``minutes`` off the reference (clocks.py)."""
        return self.clock_faults.skew_clock(replica, minutes)

    # -- waiting (settle.py) ------------------------------------------------------------

    def _settle(self) -> None:
        self.settler.settle()

    # -- the whole-database invariants (oracle.py) ----------------------------------------

    def check(self) -> None:
        """Every whole-database invariant, through the observer connection."""
        self.oracle.check()

    # -- the end of a run -------------------------------------------------------------------

    def drain(self, max_rounds: int = 200) -> None:
        """End every request and batch, disarm faults, then let the loops dispatch all that is due.

        Ends with the run's one equality: every committed outcome, as the replicas' dispatchers
        saw it, equals the model's, and nothing due is left pending (SIM-5: nothing lost).
        """
        for _ in range(max_rounds):
            progressed = False
            for c in self.requesting_clients():
                progressed |= self.end_post(c)
            for i in self.holding_replicas():
                progressed |= self.finish(i)
            if not progressed and not any(a.op for a in self.actors):
                break
            if not progressed:
                self._settle()
        for r in self.replicas:
            r.faults.armed = None
        for _ in range(max_rounds):
            if not self.model.due_pending(self.now()):
                break
            for i in range(len(self.replicas)):
                self.run(i)
        self.oracle.check_nothing_lost()
        self.check()
        self.oracle.check_host_effects()

    def close(self) -> None:
        """Unblock and end every actor, then close every connection (see ``teardown``)."""
        close_run(self)

    # -- reports ----------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        counts = self.model.committed_counts()
        return {
            "steps": dict(sorted(self.stats.steps.items())),
            "steps_total": self.step_no,
            "events_posted": self.versions,
            "rows": len(self.model.rows),
            "events_dispatched": counts["dispatched"],
            "events_failed": counts["failed"],
            "faults": dict(sorted(self.stats.faults.items())),
            "poll_errors_caught": self.stats.poll_errors,
            "blocked_steps": dict(sorted(self.stats.blocked.items())),
            "checks": dict(sorted(self.stats.checks.items())),
            "checks_total": sum(self.stats.checks.values()),
            **({} if self.probe is None else {"rollback_probes": self.probe.windows,
                                              "rollback_probes_inconclusive": self.probe.inconclusive}),
            "dispatcher": "built-in" if self.host is None else self.host.name,
        }
