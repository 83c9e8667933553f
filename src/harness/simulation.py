"""``Simulation``: several production schedulers, one PostgreSQL, one frozen clock.

Every step is an explicit method (``post``, ``claim(r)``, ``dispatch(r)``, ``crash(r)``...),
so interleavings are produced, not hoped for. After each step the simulation waits until
every actor has either finished or is seen waiting on a lock in ``pg_locks``, then compares
the database with the model (``model.py``) through a separate observer connection. A
mismatch raises ``Violation`` naming the invariant (``SIM-n`` in specs/simulation.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import wait as wait_futures
from datetime import UTC, datetime, timedelta
from typing import Any

from harness.actors import Actor, Client, Replica, Request, Stats
from harness.broken import read_then_write_begin, read_then_write_end, variant
from harness.faults import FaultyDispatcher, InjectedPollFault, PollBudget, install_rewrites
from harness.model import EVENT_FAULTS, Call, Content, Model
from harness.observer import Observer
from scheduler import store
from scheduler.clock import ManualClock
from scheduler.config import Settings
from scheduler.db import make_engine, make_sessionmaker
from scheduler.dispatch import NudgingPlatform
from scheduler.loop import Batch, PollReport, Scheduler
from scheduler.publishers import RecordingPublisher
from scheduler.rules import load_catalogue
from scheduler.types import SchedulerMode

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
SETTLE_TIMEOUT = 60.0
# How the replicas' loops pace their polls (DEC-9): every replica literal, every replica
# prompt, or mixed (odd replicas prompt).
MODES = ("literal", "prompt", "mixed")

# A prompt-mode run step lets the loop poll again at once after a full batch, at most this
# many polls; it ends with the first short batch (where the loop would start to wait).
PROMPT_RUN_POLLS = 3

# Replicas and clients wait as long as it takes: the harness, not a timeout, ends a wait.
NO_TIMEOUTS = Settings(statement_timeout_ms=0, lock_timeout_ms=0)


class Violation(AssertionError):
    """An invariant of specs/simulation.md does not hold."""

    def __init__(self, clause: str, message: str, step: int = 0) -> None:
        super().__init__(f"{clause} violated at step {step}: {message}")
        self.clause = clause
        self.message = message
        self.step = step


class HarnessError(RuntimeError):
    """The harness itself cannot go on (an actor neither finishes nor waits on a lock)."""


def _minutes(n: int) -> timedelta:
    return timedelta(minutes=n)


class Simulation:
    """One run. Use as a context manager; ``close()`` ends every connection and thread."""

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
    ) -> None:
        if replicas < 1 or clients < 1 or participants < 1:
            raise ValueError("a simulation needs at least one replica, client and participant")
        if modes not in MODES:
            raise ValueError(f"modes is one of {', '.join(MODES)}, not {modes!r}")
        self.modes = modes
        self.url = database_url
        self.seed = seed
        self.batch_size = batch_size
        self.variant = variant(scheduler)
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
        if clean:
            self.observer.truncate()
        self.caps = {f"p{i}": 1 + i % 3 for i in range(participants)}
        self.participants = participants
        self.model = Model(self.caps)
        self.clock = ManualClock(start)
        self.catalogue = load_catalogue()
        self.replicas: list[Replica] = []
        self.clients: list[Client] = []
        try:
            self._set_preferences()
            for i in range(replicas):
                self.replicas.append(self._make_replica(i))
            for i in range(clients):
                engine = make_engine(database_url, NO_TIMEOUTS, pool_size=1, max_overflow=0)
                self.clients.append(Client(f"client-{i}", i, engine))
        except BaseException:
            self.close()
            raise

    # -- setup ------------------------------------------------------------------------------

    def _set_preferences(self) -> None:
        engine = make_engine(self.url, NO_TIMEOUTS, pool_size=1, max_overflow=0)
        try:
            sessions = make_sessionmaker(engine)
            for user, cap in self.caps.items():
                store.set_preferences(sessions, user, enabled_kinds=None, max_per_day=cap, now=self.start)
        finally:
            engine.dispose()

    def _make_replica(self, index: int) -> Replica:
        engine = make_engine(self.url, NO_TIMEOUTS, pool_size=1, max_overflow=0)
        install_rewrites(engine, list(self.variant.rewrites))
        dispatcher = FaultyDispatcher(NudgingPlatform(self.catalogue), index)

        def make_scheduler(replica: Replica) -> Scheduler:
            return self.variant.scheduler_class(
                replica.sessions, replica.dispatcher, self.clock,
                publisher=RecordingPublisher(), batch_size=self.batch_size,
                poll_seconds=30.0, name=replica.name, mode=self.mode_of(index),
            )

        return Replica(f"replica-{index}", index, engine, dispatcher, make_scheduler)

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

    # -- what steps are possible now (both drivers ask) -------------------------------------

    def idle_replicas(self) -> list[int]:
        return [r.index for r in self.replicas if r.op is None and r.batch is None]

    def holding_replicas(self) -> list[int]:
        """Replicas whose thread is free and that hold a batch (live or killed)."""
        return [r.index for r in self.replicas if r.op is None and r.batch is not None]

    def live_holding_replicas(self) -> list[int]:
        return [i for i in self.holding_replicas() if not self.replicas[i].zombie]

    def busy_replicas(self) -> list[int]:
        return [r.index for r in self.replicas if r.op is not None]

    def free_clients(self) -> list[int]:
        return [c.index for c in self.clients if c.op is None and c.request is None]

    def requesting_clients(self) -> list[int]:
        """Clients with a request that has arrived and not been answered, free to answer it."""
        return [
            c.index for c in self.clients
            if c.op is None and c.request is not None and not self._row_has_waiting_writer(c.request.key, None)
        ]

    def _row_has_waiting_writer(self, key: str | None, event_id: str | None) -> bool:
        """Two writers waiting on one row would be woken in no fixed order, so a run could not
        be replayed; the drivers therefore never start a second one."""
        row = event_id if event_id is not None else (self.model.by_key.get(key) if key else None)
        return row is not None and row in {c.target for c in self.clients if c.op is not None}

    def _a_claim_waits(self) -> bool:
        """Two claims waiting at once may be woken together and race for the same participant
        locks, so which one wins is PostgreSQL's choice and a seed would not replay; the
        drivers therefore start a claim only when no other replica is waiting (DEC-SIM-6)."""
        return any(r.op is not None for r in self.replicas)

    def now(self) -> datetime:
        return self.clock.now()

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

    # -- posts (the API side) ---------------------------------------------------------------

    def _event_id(self, version: int) -> str:
        digest = hashlib.blake2b(f"{self.seed}:{version}".encode(), digest_size=16).digest()
        return str(uuid.UUID(bytes=digest, version=4))

    def _new_request(self, user: int, trigger: int, key: str | None, day: int, fault: str | None) -> Request:
        if fault is not None and fault not in EVENT_FAULTS:
            raise ValueError(f"an event fault is one of {EVENT_FAULTS}, not {fault!r}")
        self.versions += 1
        version = self.versions
        now = self.now()
        scope_day = (self.start + timedelta(days=day)).date()
        content = Content(f"p{user % self.participants}", now + _minutes(trigger), scope_day, fault, version)
        facts = {
            "facts_version": "1",
            "scenario": "commitment_reminder",
            # an unusable time scope is accepted when stored and refused when it fires (REQ-0063)
            "date": "someday" if fault == "refused" else scope_day.isoformat(),
            "commitment": f"task {version}",
            "sim_version": version,
            "sim_fault": fault,
        }
        params = {
            "event_type": "reminder",
            "user_id": content.user,
            "community_id": "c1",
            "external_key": key,
            "trigger_at": content.trigger_at,
            "facts": facts,
            "now": now,
            "event_id": self._event_id(version),
        }
        if fault:
            self._fault(f"event-{fault}-error" if fault != "refused" else "event-refused")
        return Request(key, params, content)

    def begin_post(self, client: int, user: int, trigger: int, key: str | None = None,
                   day: int = 0, fault: str | None = None) -> bool:
        """A post arrives at API client ``client`` (trigger in minutes from now, day of the facts)."""
        c = self.clients[client]
        if c.op is not None or c.request is not None:
            return False
        self._step("post", f"sim.begin_post({client}, user={user}, trigger={trigger}, key={key!r}, day={day}, fault={fault!r})")
        self._begin_request(c, user, trigger, key, day, fault)
        self._after_step()
        return True

    def _begin_request(self, c: Client, user: int, trigger: int, key: str | None, day: int, fault: str | None) -> None:
        request = self._new_request(user, trigger, key, day, fault)
        c.request = request
        c.target = None
        if self.variant.read_then_write and key is not None:
            def read() -> None:
                request.session = c.sessions()
                request.existing = read_then_write_begin(request.session, self._sql_params(request))
            c.submit("post", f"begin_post({c.index})", read, lambda _r, e: self._request_read(c, e))

    def _request_read(self, c: Client, error: BaseException | None) -> None:
        if error is not None:
            raise self.fail("SIM-2", f"{c.name}: reading key failed: {error!r}")

    @staticmethod
    def _sql_params(request: Request) -> dict[str, Any]:
        params = {k: v for k, v in request.params.items() if k != "event_id"}
        params["id"] = request.params["event_id"]
        params["facts"] = json.dumps(params["facts"])
        return params

    def end_post(self, client: int) -> bool:
        """The API answers client ``client``'s post: the store writes and commits (it may wait)."""
        if client not in self.requesting_clients():
            return False
        self._step("post", f"sim.end_post({client})")
        self._end_request(self.clients[client])
        self._after_step()
        return True

    def _end_request(self, c: Client) -> None:
        request = c.request
        assert request is not None
        if self.variant.read_then_write and request.key is not None:
            def write() -> dict[str, Any]:
                assert request.session is not None
                try:
                    return read_then_write_end(request.session, self._sql_params(request), request.existing)
                finally:
                    request.session.close()
        else:
            def write() -> dict[str, Any]:
                return store.store_event(c.sessions, **request.params)

        c.target = self.model.by_key.get(request.key) if request.key else None
        c.submit("post", f"end_post({c.index})", write,
                 lambda result, error: self._post_done(c, request, result, error),
                 lambda lock: self._write_blocked(c, request.key, None, lock))

    def post(self, user: int, trigger: int, key: str | None = None, day: int = 0,
             fault: str | None = None) -> bool:
        """A post that arrives and is answered at once, on the first free client."""
        free = self.free_clients()
        if not free or self._row_has_waiting_writer(key, None):
            return False
        c = self.clients[free[0]]
        self._step("post", f"sim.post(user={user}, trigger={trigger}, key={key!r}, day={day}, fault={fault!r})")
        self._begin_request(c, user, trigger, key, day, fault)
        self._settle()
        self._end_request(c)
        self._after_step()
        return True

    def _write_blocked(self, c: Client, key: str | None, event_id: str | None, lock: str) -> None:
        self._check("SIM-2")
        target = event_id if event_id is not None else (self.model.by_key.get(key) if key else None)
        if target is None or target not in self.model.held():
            raise self.fail("SIM-2", f"{c.name} waits on a {lock} lock although no batch holds its row")

    def _post_done(self, c: Client, request: Request, result: Any, error: BaseException | None) -> None:
        c.request = None
        key = request.key
        if error is not None:
            if c.killed:
                c.killed = False
                return
            raise self.fail("SIM-2", f"{c.name}: the post of key {key!r} failed: {error!r}")
        self._check("SIM-2")
        event_id = str(result["id"])
        if key is not None:
            known = self.model.by_key.get(key)
            if known is not None and known != event_id:
                raise self.fail("SIM-2", f"key {key!r} has two rows: {known} and {event_id}")
            holder = self.model.holder_of_key(key)
            if holder is not None:
                raise self.fail("SIM-2", f"a re-post of {key!r} finished while replica {holder} still holds the row")
        self.model.apply_post(event_id, key, request.content)

    def reset(self, row: int) -> bool:
        """The operator resets the ``row``-th stored row (modulo the count) by hand."""
        free = self.free_clients()
        if not free or not self.model.order:
            return False
        event_id = self.model.order[row % len(self.model.order)]
        if self._row_has_waiting_writer(None, event_id):
            return False
        c = self.clients[free[0]]
        c.target = event_id
        self._step("reset", f"sim.reset({row})")

        def done(result: Any, error: BaseException | None) -> None:
            if error is not None:
                if c.killed:
                    c.killed = False
                    return
                raise self.fail("SIM-2", f"reset of {event_id} failed: {error!r}")
            self._check("SIM-2")
            holder = self.model.held().get(event_id)
            if holder is not None:
                raise self.fail("SIM-2", f"a reset of {event_id} finished while replica {holder} holds it")
            self.model.apply_reset(event_id)

        c.submit("reset", f"reset({row})", lambda: store.reset_event(c.sessions, event_id, self.now()),
                 done, lambda lock: self._write_blocked(c, None, event_id, lock))
        self._after_step()
        return True

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

    # -- the scheduler's phases -------------------------------------------------------------

    def _claim_blocked(self, r: Replica, lock: str) -> None:
        self._check("SIM-1")
        if lock != "advisory":
            raise self.fail("SIM-1", f"{r.name}'s claim waits on a {lock} lock: a row another replica "
                                     "holds, which it must skip")
        raise self.fail("SIM-1", f"{r.name}'s claim waits on a participant lock: a claim only "
                                 "try-locks participants and skips busy ones (DEC-2)")

    def _check_claim(self, r: Replica, actual: list[str], expected: list[str],
                     actual_skipped: list[str] | None = None, expected_skipped: list[str] | None = None) -> None:
        self._check("SIM-6")
        busy = self.model.busy_users(besides=r.index)
        for event_id in actual:
            row = self.model.rows.get(event_id)
            if row is not None and row.content.user in busy:
                raise self.fail("SIM-6", f"{r.name} claimed {event_id} of {row.content.user}, whose "
                                         "participant lock another batch holds: the cap would be counted unlocked")
        self._check("SIM-1")
        if len(actual) > self.batch_size:
            raise self.fail("SIM-1", f"{r.name} claimed {len(actual)} rows, more than the batch size {self.batch_size}")
        self._check("SIM-2")
        held = self.model.held(besides=r.index)
        for event_id in actual:
            if event_id in held:
                raise self.fail("SIM-2", f"row {event_id} is claimed by {r.name} and replica {held[event_id]}")
        self._check("SIM-3")
        for event_id in actual:
            row = self.model.rows.get(event_id)
            if row is not None and row.status != "pending":
                raise self.fail("SIM-3", f"{r.name} claimed {event_id}, which is {row.status}")
        if actual != expected:
            raise self.fail("SIM-1", f"{r.name} claimed {self._show(actual)} but the due pending rows, "
                                     f"oldest first, were {self._show(expected)}")
        if actual_skipped is not None and actual_skipped != expected_skipped:
            raise self.fail("SIM-1", f"{r.name} skipped {self._show(actual_skipped)} as busy, but the rows "
                                     f"of participants other batches hold were {self._show(expected_skipped or [])}")

    def _show(self, ids: list[str]) -> str:
        shown = []
        for event_id in ids:
            row = self.model.rows.get(event_id)
            when = row.content.trigger_at.strftime("%d %H:%M") if row else "?"
            shown.append(f"{event_id[:8]}@{when}")
        return "[" + ", ".join(shown) + "]"

    def claim(self, replica: int) -> bool:
        """Replica ``replica`` opens a batch: it claims due pending rows (it may wait)."""
        r = self.replicas[replica]
        if r.op is not None or r.batch is not None or self._a_claim_waits():
            return False
        self._step("claim", f"sim.claim({replica})")
        armed = r.faults.armed == "claim"
        expected, skipped = ([], []) if armed else self.model.expected_claim(replica, self.now(), self.batch_size)
        if not armed:
            self.model.open_batch(replica, expected, skipped)

        def done(batch: Any, error: BaseException | None) -> None:
            if error is not None:
                if r.killed or (armed and isinstance(error, InjectedPollFault)):
                    self._poll_failed(r)
                    return
                if replica in self.model.batches:
                    self.model.discard(replica)
                raise self.fail("SIM-4", f"{r.name}'s claim raised {error!r}")
            r.batch = batch
            self._check_claim(r, [e.id for e in batch.events], expected, list(batch.skipped), skipped)

        r.submit("claim", f"claim({replica})", r.scheduler.claim, done, lambda lock: self._claim_blocked(r, lock))
        self._after_step()
        return True

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

    def _call(self, r: Replica, raw: dict[str, Any]) -> Call:
        serial = self.model.batches[r.index].serial if r.index in self.model.batches else 0
        return Call(r.index, str(raw["event_id"]), int(raw["version"]), str(raw["result"]),
                    raw["outcome"], tuple(raw["notification_ids"]), serial)

    def dispatch(self, replica: int) -> bool:
        """Replica ``replica`` dispatches the next event of its batch, in its own savepoint."""
        r = self.replicas[replica]
        if r.op is not None or r.batch is None:
            return False
        self._step("dispatch", f"sim.dispatch({replica})")
        batch = r.batch
        expected = None if r.zombie else self.model.next_expected(replica)

        def done(outcome: Any, error: BaseException | None) -> None:
            calls = [self._call(r, c) for c in r.dispatcher.take_calls()]
            if r.zombie or r.killed:
                if error is not None:
                    self._poll_failed(r)
                return
            if error is not None:
                self._poll_failed(r)
                raise self.fail("SIM-4", f"{r.name}: dispatch_next raised {error!r}: a failing event "
                                         "took its batch down")
            self._check("SIM-4")
            if outcome is None:
                if expected is not None:
                    raise self.fail("SIM-1", f"{r.name} stopped before {expected[0]}")
                return
            if expected is None:
                raise self.fail("SIM-1", f"{r.name} dispatched {outcome.id}, which it never claimed")
            event_id, status = expected
            if outcome.id != event_id:
                raise self.fail("SIM-1", f"{r.name} dispatched {outcome.id} before {event_id}")
            if outcome.status != status:
                raise self.fail("SIM-4", f"{r.name}: {event_id} ended {outcome.status}, expected {status} "
                                         f"({outcome.error or 'no error'})")
            call = calls[-1] if calls else None
            self._check("SIM-2")
            if call is None or call.event_id != event_id or call.version != self.model.batches[replica].versions[event_id]:
                raise self.fail("SIM-2", f"{r.name} dispatched other content than the row it locked: {call}")
            # A failing event rolls its batch back to the checkpoint: the events since it were
            # called again (their new calls replace the rolled-back ones) and so was this one.
            for earlier in calls[:-1]:
                self.model.record_replay(replica, earlier, current=event_id)
            self.model.record_outcome(replica, event_id, outcome.status, call)

        r.submit("dispatch", f"dispatch({replica})", lambda: r.scheduler.dispatch_next(batch), done)
        self._after_step()
        return True

    def finish(self, replica: int) -> bool:
        """Replica ``replica`` commits its batch (events not dispatched stay pending)."""
        return self._finish(replica, "finish")

    def stop(self, replica: int) -> bool:
        """Stop replica ``replica`` while it holds a batch: the loop's stop path, then no locks."""
        r = self.replicas[replica]
        if r.op is not None or r.batch is None or r.zombie:
            return False
        return self._finish(replica, "stop")

    def _finish(self, replica: int, kind: str) -> bool:
        r = self.replicas[replica]
        if r.op is not None or r.batch is None:
            return False
        self._step(kind, f"sim.{kind}({replica})")
        if kind == "stop":
            self._fault("stop-holding-batch")
        batch = r.batch
        armed = r.faults.armed == "commit"

        def done(report: Any, error: BaseException | None) -> None:
            r.batch = None
            if r.zombie or r.killed:
                if error is None:
                    raise self.fail("SIM-5", f"{r.name} committed a batch whose backend was killed")
                self._poll_failed(r)
                return
            if error is not None:
                self._poll_failed(r)
                if armed and isinstance(error, InjectedPollFault):
                    return
                raise self.fail("SIM-4", f"{r.name}: finishing the batch raised {error!r}")
            self.model.commit(replica)
            if kind == "stop":
                self._check_stopped(r)

        r.submit(kind, f"{kind}({replica})", lambda: r.scheduler.finish(batch), done)
        self._after_step()
        return True

    def _check_stopped(self, r: Replica) -> None:
        self._check("SIM-7")
        if r.pid is None:
            return
        held = self.observer.held_locks([r.pid]).get(r.pid)
        state = self.observer.states([r.pid]).get(r.pid)
        if held or state == "idle in transaction":
            raise self.fail("SIM-7", f"{r.name} has stopped but its backend is {state} holding {held}")

    def run(self, replica: int, stop_after: int | None = None) -> bool:
        """Replica ``replica`` runs the production loop (``run_blocking``) for one poll,
        stopped after ``stop_after`` events; two polls if its next poll is armed to fail."""
        r = self.replicas[replica]
        if r.op is not None or r.batch is not None or self._a_claim_waits():
            return False
        if r.scheduler.mode is SchedulerMode.PROMPT:
            return self._run_prompt(r, stop_after)
        self._step("run", f"sim.run({replica}, stop_after={stop_after})")
        armed = r.faults.armed
        polls = 2 if armed == "claim" else 1
        expected, skipped = self.model.expected_claim(replica, self.now(), self.batch_size)
        self.model.open_batch(replica, expected, skipped)
        limit = len(expected) if stop_after is None else min(stop_after, len(expected))
        stop = PollBudget(polls)
        counted = [0]

        def on_call() -> None:
            # Events, not calls: a failing event makes the loop call the events before it again.
            counted[0] = len({c["event_id"] for c in r.dispatcher.calls})
            if stop_after is not None and counted[0] >= stop_after:
                stop.set()

        health = r.scheduler.health
        polls_before = health.polls
        if stop_after is not None and stop_after < len(expected):
            self._fault("stop-mid-batch")

        def loop() -> None:
            r.dispatcher.on_call = on_call
            try:
                r.scheduler.run_blocking(stop)
            finally:
                r.dispatcher.on_call = None

        def done(_: Any, error: BaseException | None) -> None:
            calls = self.model.last_calls([self._call(r, c) for c in r.dispatcher.take_calls()])
            if error is not None:
                self._poll_failed(r)
                raise self.fail("SIM-4", f"{r.name}: the loop itself died: {error!r}")
            if r.killed:
                self._poll_failed(r)
                self._check_loop_survived(r, "")
                return
            self._check("SIM-4")
            committed = health.polls - polls_before
            for call in calls:
                self.model.batches[replica].calls.append(call)
            if armed == "commit":
                self.stats.poll_errors += 1
                self.model.discard(replica)
                if committed != 0:
                    raise self.fail("SIM-5", f"{r.name} committed a poll whose commit failed")
                self._check_loop_survived(r, "InjectedPollFault")
                return
            if committed != 1:
                self.model.discard(replica)
                raise self.fail("SIM-4", f"{r.name}'s poll rolled back ({health.last_error}): "
                                         "one failing event took the batch down")
            if armed == "claim":
                self.stats.poll_errors += 1
                self._check_loop_survived(r, "InjectedPollFault")
            dispatched = [c.event_id for c in calls]
            report = r.scheduler.last_report
            if report is not None and report.skipped != len(skipped):
                self.model.discard(replica)
                raise self.fail("SIM-1", f"{r.name}'s loop skipped {report.skipped} rows as busy, "
                                         f"expected {self._show(skipped)}")
            if dispatched != expected[:limit]:
                self.model.discard(replica)
                raise self.fail("SIM-1", f"{r.name}'s loop dispatched {self._show(dispatched)}, "
                                         f"expected {self._show(expected[:limit])}")
            batch = self.model.batches[replica]
            batch.calls.clear()
            for call in calls:
                self.model.record_outcome(replica, call.event_id,
                                          "dispatched" if call.result == "ok" else "failed", call)
            self.model.commit(replica)
            if stop_after is not None:
                self._check_stopped(r)

        def blocked(lock: str) -> None:
            # Only the claim is checked here: once events are being dispatched, a wait (possible
            # only when participants are not locked) is left to play out for SIM-6 to judge.
            if not r.dispatcher.calls:
                self._claim_blocked(r, lock)

        r.submit("run", f"run({replica})", loop, done, blocked)
        self._after_step()
        return True

    def _run_prompt(self, r: Replica, stop_after: int | None) -> bool:
        """A prompt-mode replica runs the production loop: it polls again at once after each
        full batch (at most ``PROMPT_RUN_POLLS`` polls) and the step ends with the first short
        one, where the loop would start to wait. A poll hook ends the loop there; an armed
        claim fault fails the first poll and a wake-up makes the loop poll again at once."""
        replica = r.index
        self._step("run", f"sim.run({replica}, stop_after={stop_after})")
        armed = r.faults.armed
        first, first_skipped = ([], []) if armed == "claim" else \
            self.model.expected_claim(replica, self.now(), self.batch_size)
        self.model.open_batch(replica, first, first_skipped)
        stop = threading.Event()
        counted = [0]
        failures = [0]
        reports: list[PollReport] = []
        health = r.scheduler.health
        polls_before = health.polls

        def on_call() -> None:
            # events, not calls: a failure replays the batch's earlier events (DEC-1)
            counted[0] = len({c["event_id"] for c in r.dispatcher.calls})
            if stop_after is not None and counted[0] >= stop_after:
                stop.set()

        def after_poll(scheduler: Scheduler) -> None:
            if health.consecutive_failures:
                failures[0] += 1
                if armed == "claim" and not reports and failures[0] == 1:
                    scheduler.announce(None)  # the loop would wait; look again at once instead
                else:
                    stop.set()
                return
            report = scheduler.last_report
            assert report is not None
            reports.append(report)
            if report.claimed < self.batch_size or len(reports) >= PROMPT_RUN_POLLS:
                stop.set()

        if stop_after is not None:
            self._fault("stop-mid-batch")

        def loop() -> None:
            r.dispatcher.on_call = on_call
            r.scheduler.poll_hooks.append(after_poll)
            try:
                r.scheduler.run_blocking(stop)
            finally:
                r.scheduler.poll_hooks.remove(after_poll)
                r.dispatcher.on_call = None

        def done(_: Any, error: BaseException | None) -> None:
            calls = [self._call(r, c) for c in r.dispatcher.take_calls()]
            if error is not None:
                self._poll_failed(r)
                raise self.fail("SIM-4", f"{r.name}: the loop itself died: {error!r}")
            if r.killed:
                self._poll_failed(r)
                self._check_loop_survived(r, "")
                return
            self._check("SIM-4")
            if armed == "commit":
                self.stats.poll_errors += 1
                self.model.discard(replica)
                if health.polls != polls_before:
                    raise self.fail("SIM-5", f"{r.name} committed a poll whose commit failed")
                self._check_loop_survived(r, "InjectedPollFault")
                return
            if armed == "claim":
                self.stats.poll_errors += 1
                self._check_loop_survived(r, "InjectedPollFault")
                self.model.discard(replica)
            self._replay_prompt_polls(r, calls, reports, stop_after, armed == "claim")
            if stop_after is not None:
                self._check_stopped(r)

        r.submit("run", f"run({replica})", loop, done, lambda lock: self._claim_blocked(r, lock))
        self._after_step()
        return True

    def _replay_prompt_polls(self, r: Replica, calls: list[Call], reports: list[PollReport],
                             stop_after: int | None, reopen: bool) -> None:
        """Check a prompt-mode run poll by poll against the model: each poll's claim, its
        batch bound, its skipped rows and its calls; and that the loop polled again exactly
        after each full batch."""
        replica = r.index
        self._check("SIM-1")
        budget = stop_after
        position = 0
        for number, report in enumerate(reports):
            if report.claimed > self.batch_size:
                if replica in self.model.batches:
                    self.model.discard(replica)
                raise self.fail("SIM-1", f"{r.name}'s prompt-mode poll {number + 1} claimed {report.claimed} rows, "
                                         f"more than the batch size {self.batch_size}")
            if number > 0 or reopen:
                expected, skipped = self.model.expected_claim(replica, self.now(), self.batch_size)
                self.model.open_batch(replica, expected, skipped)
            batch = self.model.batches[replica]
            expected, skipped = batch.ids, batch.skipped
            take = len(expected) if budget is None else min(budget, len(expected))
            # this poll's calls: its events are its own (a row is terminal once committed),
            # and replays after a failure repeat them; the final call of each one counts
            end = position
            while end < len(calls) and calls[end].event_id in expected:
                end += 1
            mine = self.model.last_calls(calls[position:end])
            position = end
            if [c.event_id for c in mine] != expected[:take] or report.skipped != len(skipped):
                self.model.discard(replica)
                raise self.fail("SIM-1", f"{r.name}'s prompt-mode poll {number + 1} dispatched "
                                         f"{self._show([c.event_id for c in mine])} (skipping {report.skipped}), "
                                         f"expected {self._show(expected[:take])} (skipping {len(skipped)})")
            for call in mine:
                self.model.record_outcome(replica, call.event_id,
                                          "dispatched" if call.result == "ok" else "failed", call)
            self.model.commit(replica)
            if budget is not None:
                budget -= take
            full = len(expected) >= self.batch_size
            again = full and (budget is None or budget > 0) and number + 1 < PROMPT_RUN_POLLS
            polled_again = number + 1 < len(reports)
            if again != polled_again:
                raise self.fail("SIM-1", f"{r.name} in prompt mode {'polled again' if polled_again else 'waited'} "
                                         f"after a {'full' if full else 'short'} batch")
        if not reports and replica in self.model.batches:
            self.model.discard(replica)
        if position != len(calls):
            raise self.fail("SIM-1", f"{r.name} made {len(calls) - position} dispatcher calls no poll accounts for")

    def _check_loop_survived(self, r: Replica, needle: str) -> None:
        self._check("SIM-4")
        error = r.scheduler.health.last_error
        if error is None or needle not in error:
            raise self.fail("SIM-4", f"{r.name}'s loop did not record the failed poll (last_error={error!r})")

    # -- faults -----------------------------------------------------------------------------

    def fail_next_poll(self, replica: int, where: str = "claim") -> bool:
        """Arm replica ``replica`` so that its next poll raises outside any event."""
        r = self.replicas[replica]
        if r.op is not None or r.faults.armed is not None:
            return False
        self._step("fail_next_poll", f"sim.fail_next_poll({replica}, {where!r})")
        self._fault(f"poll-error-{where}")
        r.faults.arm(where)
        self._after_step()
        return True

    def crash(self, replica: int) -> bool:
        """Replica ``replica``'s process dies mid-batch: its connection closes without commit."""
        r = self.replicas[replica]
        if r.op is not None or r.batch is None or r.zombie:
            return False
        self._step("crash", f"sim.crash({replica})")
        self._fault("crash")
        batch = r.batch
        pid = r.pid

        def die() -> None:
            connection = batch.session.connection()
            connection.invalidate()  # closes the DBAPI connection: no COMMIT is ever sent
            with contextlib.suppress(Exception):
                batch.session.close()

        def done(_: Any, error: BaseException | None) -> None:
            if error is not None:
                raise HarnessError(f"crashing {r.name} failed: {error!r}")
            if pid is not None:
                self.observer.wait_gone(pid)
            self.model.discard(replica)
            r.dispatcher.take_calls()
            r.restart()

        r.submit("crash", f"crash({replica})", die, done)
        self._after_step()
        return True

    def kill(self, replica: int) -> bool:
        """``pg_terminate_backend`` on replica ``replica``'s backend, from the observer's session."""
        r = self.replicas[replica]
        holding = r.op is None and r.batch is not None and not r.zombie
        if not (holding or r.op is not None) or r.pid is None:
            return False
        self._step("kill", f"sim.kill({replica})")
        self._fault("kill")
        r.killed = True
        self.observer.terminate(r.pid)
        if holding:
            r.zombie = True
            r.killed = False
            self.model.discard(replica)
        self._after_step()
        return True

    # -- waiting ----------------------------------------------------------------------------

    def _settle(self) -> None:
        """Wait until every actor has finished or waits on a lock; process what finished."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            busy = [a for a in self.actors if a.op is not None]
            if not busy:
                return
            finished = [a for a in busy if self._finished_or_waiting(a, deadline)]
            if finished:
                for a in sorted(finished, key=lambda a: a.rank):
                    self._complete(a)
                continue
            if not self._wait_cycle(busy):
                return
            # PostgreSQL breaks a deadlock after deadlock_timeout; wait for that verdict.
            wait_futures([a.op.future for a in busy if a.op], timeout=SETTLE_TIMEOUT,
                         return_when=FIRST_COMPLETED)

    def _finished_or_waiting(self, a: Actor, deadline: float) -> bool:
        op = a.op
        assert op is not None
        wait_futures([op.future], timeout=0.002)
        while not op.future.done():
            lock = self.observer.waiting([a.pid] if a.pid else []).get(a.pid or 0)
            if lock is not None and self._stably_blocked(a):
                if not op.blocked:
                    op.blocked = True
                    Stats.bump(self.stats.blocked, op.kind)
                    if op.on_blocked is not None:
                        op.on_blocked(lock)
                return False
            if time.monotonic() > deadline:
                raise HarnessError(f"{a.name} neither finished {op.code} nor waited on a lock "
                                   f"within {SETTLE_TIMEOUT:g}s")
            wait_futures([op.future], timeout=0.002)
        return True

    def _stably_blocked(self, a: Actor) -> bool:
        """A wait counts only when every blocker is one of our actors that cannot move by
        itself (idle in its transaction, or waiting too). A wait on anything else (autovacuum,
        a relation-extension lock of a backend that is running) ends by itself, so stopping
        there would let timing decide the next step and a seed would not replay."""
        blockers = self.observer.blockers([a.pid] if a.pid else []).get(a.pid or 0, [])
        ours = {x.pid for x in self.actors if x.pid}
        if not blockers or not set(blockers) <= ours:
            return False
        return self.observer.stuck(blockers) == set(blockers)

    def _complete(self, a: Actor) -> None:
        op = a.op
        assert op is not None
        a.op = None
        error = op.future.exception()
        op.on_done(None if error is not None else op.future.result(), error)

    def _wait_cycle(self, busy: list[Actor]) -> bool:
        pids = {a.pid for a in busy if a.pid}
        graph = {pid: [b for b in blockers if b in pids] for pid, blockers in self.observer.blockers(pids).items()}
        seen: set[int] = set()

        def cyclic(node: int, path: set[int]) -> bool:
            if node in path:
                return True
            if node in seen:
                return False
            seen.add(node)
            return any(cyclic(n, path | {node}) for n in graph.get(node, []))

        return any(cyclic(p, set()) for p in graph)

    # -- the oracle's checks over the committed state ---------------------------------------

    def check(self) -> None:
        """Every whole-database invariant, through the observer connection."""
        self.check_rows()
        self.check_effects()
        self.check_cap_and_dedup()
        self.check_idle_replicas()

    def check_rows(self) -> None:
        """The committed rows equal the model's: statuses commit with their batch (SIM-5),
        content is the last post's (SIM-2), REQ-0067's columns follow the status (SIM-4)."""
        self._check("SIM-5")
        db = self.observer.rows()
        model = self.model.rows
        if set(db) != set(model):
            lost = sorted(set(model) - set(db))
            extra = sorted(set(db) - set(model))
            raise self.fail("SIM-2", f"rows lost {lost} / rows nobody posted {extra}")
        held = self.model.held()
        for event_id, row in model.items():
            got = db[event_id]
            if (got.version, got.user_id, got.trigger_at) != (row.content.version, row.content.user, row.content.trigger_at):
                raise self.fail("SIM-2", f"row {event_id} holds post v{got.version} for {got.user_id}, "
                                         f"but the last post was v{row.content.version} for {row.content.user}")
            if got.status != row.status:
                where = f" (held by replica {held[event_id]}, whose batch has not committed)" if event_id in held else ""
                raise self.fail("SIM-5", f"row {event_id} is {got.status} in the database but "
                                         f"{row.status} in the model{where}")
            if (got.has_error, got.has_dispatched_at) != (row.has_error, row.has_dispatched_at):
                raise self.fail("SIM-4", f"row {event_id} ({got.status}): last_error set={got.has_error}, "
                                         f"dispatched_at set={got.has_dispatched_at}")

    def _calls_by_notification(self) -> dict[str, Call]:
        calls = [*self.model.committed_calls, *self.model.discarded_calls]
        for batch in self.model.batches.values():
            calls.extend(batch.calls)
        return {n: c for c in calls for n in c.notification_ids}

    def check_effects(self) -> None:
        """Exactly the notifications of committed successful dispatches exist (SIM-4, SIM-5)."""
        self._check("SIM-5")
        seen: set[str] = set()
        stray_duplicates: list[str | None] = []
        for notification_id, event_id, _status, reason in self.observer.notifications():
            if reason == "suppressed_dedup":
                if event_id not in self.model.duplicate_events:
                    stray_duplicates.append(event_id)
                continue
            seen.add(notification_id)
        expected = self.model.expected_notifications
        if seen == expected and not stray_duplicates:
            return
        calls = self._calls_by_notification()
        # A failed event's effects first: they explain a stray duplicate record too (its
        # replay found its own first attempt's key).
        for notification_id in sorted(seen - expected):
            call = calls.get(notification_id)
            if call is not None and call.result != "ok":
                raise self.fail("SIM-4", f"notification {notification_id} of failed event {call.event_id} "
                                         "is visible: the failing event's effects were not rolled back")
        if stray_duplicates:
            raise self.fail("SIM-5", f"a duplicate record for {stray_duplicates[0]}, whose duplicate dispatch "
                                     "never committed")
        for notification_id in sorted(seen - expected):
            call = calls.get(notification_id)
            raise self.fail("SIM-5", f"notification {notification_id} (event {call.event_id if call else '?'}) "
                                     "is visible though its batch never committed")
        missing = sorted(expected - seen)
        raise self.fail("SIM-5", f"committed notifications vanished: {missing}")

    def check_cap_and_dedup(self) -> None:
        """No participant above their daily cap; no dedup key sent twice (SIM-6)."""
        self._check("SIM-6")
        for (user, day), sent in self.observer.sent_per_day().items():
            cap = self.caps.get(user)
            if cap is not None and sent > cap:
                raise self.fail("SIM-6", f"{user} got {sent} notifications on {day}, cap {cap}")
        twice = self.observer.keys_sent_twice()
        if twice:
            raise self.fail("SIM-6", f"dedup keys sent more than once: {twice}")

    def check_idle_replicas(self) -> None:
        """A replica without a batch holds no lock and no open transaction (SIM-7)."""
        self._check("SIM-7")
        idle = {r.pid: r for r in self.replicas if r.op is None and r.batch is None and r.pid}
        if not idle:
            return
        held = self.observer.held_locks(idle)
        states = self.observer.states(idle)
        for pid, r in idle.items():
            if held.get(pid) or states.get(pid) == "idle in transaction":
                raise self.fail("SIM-7", f"{r.name} holds no batch but its backend is {states.get(pid)} "
                                         f"holding {held.get(pid)}")

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
        self._check("SIM-5")
        left = self.model.due_pending(self.now())
        if left:
            raise self.fail("SIM-5", f"due rows never dispatched: {left}")
        seen = sorted((c.event_id, c.version, "dispatched" if c.result == "ok" else "failed")
                      for c in self.model.committed_calls)
        expected = sorted((i, v, s) for i, _g, v, s in self.model.processed)
        if seen != expected:
            raise self.fail("SIM-5", "committed dispatches differ from the model's: "
                                     f"extra {sorted(set(seen) - set(expected))}, "
                                     f"missing {sorted(set(expected) - set(seen))}")
        self.check()

    def close(self) -> None:
        """Unblock and end every actor, then close every connection."""
        observer = getattr(self, "observer", None)
        for a in self.actors:
            if a.op is not None and a.pid and observer is not None:
                with contextlib.suppress(Exception):
                    observer.terminate(a.pid)
        for a in self.actors:
            if a.op is not None:
                wait_futures([a.op.future], timeout=SETTLE_TIMEOUT)
                future, a.op = a.op.future, None
                # an op that finished unprocessed (a violation stopped the processing) may
                # have opened a batch nobody else knows of
                result = future.result() if future.done() and future.exception() is None else None
                if isinstance(result, Batch) and isinstance(a, Replica):
                    with contextlib.suppress(Exception):
                        a.scheduler.abort(result)
        for r in self.replicas:
            if r.batch is not None:
                with contextlib.suppress(Exception):
                    r.scheduler.abort(r.batch)
                r.batch = None
        for c in self.clients:
            if c.request is not None and c.request.session is not None:
                with contextlib.suppress(Exception):
                    c.request.session.close()
            c.request = None
        for a in self.actors:
            a.shutdown()
        if observer is not None:
            # Whatever was missed above, no backend of this run outlives it.
            with contextlib.suppress(Exception):
                for pid in observer.alive({p for a in self.actors for p in a.pids}):
                    observer.terminate(pid)
        self.replicas, self.clients = [], []
        if observer is not None:
            observer.close()

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
        }
