"""The API side of a run: posts (in one step, or arriving and answered in two), resets by
hand and cancels.

A post is made of a ``Request`` (the row it will write, its content in the model) that a
client thread answers; with the read-then-write broken variant the client reads the key
when the request arrives and writes when it answers. Every callback a client thread runs
is a named method here, bound to its client and request with ``functools.partial``.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

from harness.actors import Client, Request
from harness.broken import read_then_write_begin, read_then_write_end
from harness.model import EVENT_FAULTS, Content
from harness.types import RunContext
from scheduler.application import commands
from scheduler.core import store
from scheduler.types import DigitalTwinEvent

SIMULATION = commands.Actor("simulation", "simulation")


def _minutes(n: int) -> timedelta:
    return timedelta(minutes=n)


def _window_arg(window: int | None) -> str:
    """The program line's ``window=`` argument, only when the post has one (older programs replay as written)."""
    return "" if window is None else f", window={window}"


class Posts:
    """The post, reset and cancel steps of one run (``Simulation.post``, ``begin_post``,
    ``end_post``, ``reset``, ``cancel``)."""

    def __init__(self, sim: RunContext) -> None:
        self.sim = sim

    # -- a request and its row ----------------------------------------------------------

    def event_id(self, version: int) -> str:
        """A seeded row id, so that a replayed run claims rows in the same order."""
        digest = hashlib.blake2b(f"{self.sim.seed}:{version}".encode(), digest_size=16).digest()
        return str(uuid.UUID(bytes=digest, version=4))

    def new_request(self, user: int, trigger: int, key: str | None, day: int, fault: str | None,
                    window: int | None = None) -> Request:
        sim = self.sim
        if fault is not None and fault not in EVENT_FAULTS:
            raise ValueError(f"an event fault is one of {EVENT_FAULTS}, not {fault!r}")
        if fault is not None and fault not in sim.event_faults:
            raise ValueError(f"the {fault!r} fault assumes the built-in platform's refusal; a host's "
                             f"dispatcher takes {', '.join(sim.event_faults)}")
        sim.versions += 1
        version = sim.versions
        now = sim.now()
        scope_day = (sim.start + timedelta(days=day)).date()
        user_id = f"p{user % sim.participants}"
        facts = {
            "facts_version": "1",
            "scenario": "commitment_reminder",
            # an unusable time scope is accepted when stored and refused when it fires (REQ-0063)
            "date": "someday" if fault == "refused" else scope_day.isoformat(),
            "commitment": f"task {version}",
            "sim_version": version,
            "sim_fault": fault,
        }
        event_id = self.event_id(version)
        expected = sim.expect(DigitalTwinEvent("reminder", user_id, "c1", facts, event_id))
        trigger_at = now + _minutes(trigger)
        expires_at = None if window is None else trigger_at + _minutes(window)
        content = Content(user_id, trigger_at, scope_day, fault, version, expected, expires_at)
        params = {
            "event_type": "reminder",
            "user_id": content.user,
            "community_id": "c1",
            "external_key": key,
            "trigger_at": content.trigger_at,
            "expires_at": expires_at,
            "facts": facts,
            "now": now,
            "event_id": event_id,
        }
        if fault:
            sim._fault({"refused": "event-refused", "slow": "event-slow"}.get(fault, f"event-{fault}-error"))
        return Request(key, params, content)

    @staticmethod
    def sql_params(request: Request) -> dict[str, Any]:
        params = {k: v for k, v in request.params.items() if k != "event_id"}
        params["id"] = request.params["event_id"]
        params["facts"] = json.dumps(params["facts"])
        return params

    # -- the steps --------------------------------------------------------------------------

    def begin_post(self, client: int, user: int, trigger: int, key: str | None = None,
                   day: int = 0, fault: str | None = None, window: int | None = None) -> bool:
        """A post arrives at API client ``client`` (trigger in minutes from now, day of the facts)."""
        sim = self.sim
        c = sim.clients[client]
        if c.op is not None or c.request is not None:
            return False
        sim._step("post", f"sim.begin_post({client}, user={user}, trigger={trigger}, key={key!r}, day={day}, "
                          f"fault={fault!r}{_window_arg(window)})")
        self.begin_request(c, user, trigger, key, day, fault, window)
        sim._after_step()
        return True

    def end_post(self, client: int) -> bool:
        """The API answers client ``client``'s post: the store writes and commits (it may wait)."""
        sim = self.sim
        if client not in sim.requesting_clients():
            return False
        sim._step("post", f"sim.end_post({client})")
        self.end_request(sim.clients[client])
        sim._after_step()
        return True

    def post(self, user: int, trigger: int, key: str | None = None, day: int = 0,
             fault: str | None = None, window: int | None = None) -> bool:
        """A post that arrives and is answered at once, on the first free client."""
        sim = self.sim
        free = sim.free_clients()
        if not free or sim._row_has_waiting_writer(key, None):
            return False
        c = sim.clients[free[0]]
        sim._step("post", f"sim.post(user={user}, trigger={trigger}, key={key!r}, day={day}, fault={fault!r}"
                          f"{_window_arg(window)})")
        self.begin_request(c, user, trigger, key, day, fault, window)
        sim._settle()
        self.end_request(c)
        sim._after_step()
        return True

    def reset(self, row: int) -> bool:
        """The operator resets the ``row``-th stored row (modulo the count) by hand."""
        return self._write_row("reset", row, self.write_reset, self.reset_done)

    def cancel(self, row: int) -> bool:
        """A sender cancels the ``row``-th stored row (modulo the count); it may race a dispatch."""
        return self._write_row("cancel", row, self.write_cancel, self.cancel_done)

    def _write_row(self, kind: str, row: int, write: Callable[[Client, str], Any],
                   done: Callable[[Client, str, Any, BaseException | None], None]) -> bool:
        """A client writes one existing row by id (a reset, a cancel): never a second writer
        on a row that already has one waiting (DEC-SIM-6)."""
        sim = self.sim
        free = sim.free_clients()
        if not free or not sim.model.order:
            return False
        event_id = sim.model.order[row % len(sim.model.order)]
        if sim._row_has_waiting_writer(None, event_id):
            return False
        c = sim.clients[free[0]]
        c.target = event_id
        sim._step(kind, f"sim.{kind}({row})")
        c.submit(kind, f"{kind}({row})", partial(write, c, event_id),
                 partial(done, c, event_id), partial(self.write_blocked, c, None, event_id))
        sim._after_step()
        return True

    # -- what the client threads run ----------------------------------------------------------

    def begin_request(self, c: Client, user: int, trigger: int, key: str | None, day: int, fault: str | None,
                      window: int | None = None) -> None:
        request = self.new_request(user, trigger, key, day, fault, window)
        c.request = request
        c.target = None
        if self.sim.variant.read_then_write and key is not None:
            c.submit("post", f"begin_post({c.index})", partial(self.read_existing, c, request),
                     partial(self.request_read, c))

    def read_existing(self, c: Client, request: Request) -> None:
        """Read-then-write variant: the read, when the request arrives."""
        request.session = c.sessions()
        request.existing = read_then_write_begin(request.session, self.sql_params(request))

    def request_read(self, c: Client, _: Any, error: BaseException | None) -> None:
        if error is not None:
            raise self.sim.fail("SIM-2", f"{c.name}: reading key failed: {error!r}")

    def end_request(self, c: Client) -> None:
        sim = self.sim
        request = c.request
        assert request is not None
        if sim.variant.read_then_write and request.key is not None:
            write = partial(self.write_after_read, request)
        else:
            write = partial(self.write_upsert, c, request)
        c.target = sim.model.by_key.get(request.key) if request.key else None
        c.submit("post", f"end_post({c.index})", write, partial(self.post_done, c, request),
                 partial(self.write_blocked, c, request.key, None))

    def write_after_read(self, request: Request) -> dict[str, Any]:
        """Read-then-write variant: the write, on the session that read."""
        assert request.session is not None
        try:
            return read_then_write_end(request.session, self.sql_params(request), request.existing)
        finally:
            request.session.close()

    @staticmethod
    def write_upsert(c: Client, request: Request) -> dict[str, Any]:
        """The production store: one atomic insert or upsert by key."""
        return store.store_event(c.database, **request.params)

    # The operator's reset and the sender's cancel are production's own commands (audited,
    # with the same source statuses as every adapter), not a copy of their SQL.
    def write_reset(self, c: Client, event_id: str) -> commands.ResetResult:
        return commands.reset(c.database, event_id, now=self.sim.now(), actor=SIMULATION)

    def write_cancel(self, c: Client, event_id: str) -> commands.CancelResult:
        return commands.cancel(c.database, now=self.sim.now(), event_id=event_id, actor=SIMULATION)

    # -- what their results mean ----------------------------------------------------------

    def write_blocked(self, c: Client, key: str | None, event_id: str | None, lock: str) -> None:
        sim = self.sim
        sim._check("SIM-2")
        target = event_id if event_id is not None else (sim.model.by_key.get(key) if key else None)
        if target is None or target not in sim.model.held():
            raise sim.fail("SIM-2", f"{c.name} waits on a {lock} lock although no batch holds its row")

    def post_done(self, c: Client, request: Request, result: Any, error: BaseException | None) -> None:
        sim = self.sim
        c.request = None
        key = request.key
        if error is not None:
            if c.killed:
                c.killed = False
                return
            raise sim.fail("SIM-2", f"{c.name}: the post of key {key!r} failed: {error!r}")
        sim._check("SIM-2")
        event_id = str(result["id"])
        if key is not None:
            known = sim.model.by_key.get(key)
            if known is not None and known != event_id:
                raise sim.fail("SIM-2", f"key {key!r} has two rows: {known} and {event_id}")
            holder = sim.model.holder_of_key(key)
            if holder is not None:
                raise sim.fail("SIM-2", f"a re-post of {key!r} finished while replica {holder} still holds the row")
        sim.model.apply_post(event_id, key, request.content)

    def _write_failed(self, c: Client, what: str, error: BaseException | None) -> bool:
        """True when a reset or cancel did not happen because its backend was killed (a
        fault, not a violation); any other error is one."""
        if error is None:
            return False
        if c.killed:
            c.killed = False
            return True
        raise self.sim.fail("SIM-2", f"{what} failed: {error!r}")

    def reset_done(self, c: Client, event_id: str, result: Any, error: BaseException | None) -> None:
        sim = self.sim
        if self._write_failed(c, f"reset of {event_id}", error):
            return
        sim._check("SIM-2")
        holder = sim.model.held().get(event_id)
        if holder is not None:
            raise sim.fail("SIM-2", f"a reset of {event_id} finished while replica {holder} holds it")
        problem = sim.model.apply_reset(event_id, result.outcome)
        if problem is not None:
            raise sim.fail("SIM-2", problem)

    def cancel_done(self, c: Client, event_id: str, result: Any, error: BaseException | None) -> None:
        sim = self.sim
        if self._write_failed(c, f"cancel of {event_id}", error):
            return
        sim._check("SIM-CANCEL")
        holder = sim.model.held().get(event_id)
        if holder is not None:
            raise sim.fail("SIM-CANCEL", f"a cancel of {event_id} finished while replica {holder} holds it")
        problem = sim.model.apply_cancel(event_id, result.outcome)
        if problem is not None:
            raise sim.fail("SIM-CANCEL", problem)
