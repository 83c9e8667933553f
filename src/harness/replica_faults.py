"""Faults a step does to a replica: a poll armed to fail, a process crash, a killed backend,
a replica frozen mid-batch past the idle-in-transaction timeout.

(Faults inside an event, and the broken variants, live in ``faults.py`` and ``broken.py``.)
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any

from harness.actors import Replica
from harness.settle import HarnessError
from harness.types import RunContext
from scheduler.core.loop import Batch
from scheduler.database.engine import SESSION_TIME_ZONE
from scheduler.database.queries import Statements
from scheduler.nudging.orchestrator import RecordingPublisher

# The frozen replica's bound on idling inside its transaction, in ms: production's setting
# (SCHEDULER_IDLE_IN_TRANSACTION_TIMEOUT_MS, 10 s) shortened so that a step need not wait.
FREEZE_TIMEOUT_MS = 50


class ReplicaFaults:
    """The ``fail_next_poll``, ``crash`` and ``kill`` steps of one run."""

    def __init__(self, sim: RunContext) -> None:
        self.sim = sim
        self.published_at_freeze: dict[int, int] = {}

    def fail_next_poll(self, replica: int, where: str = "claim") -> bool:
        """Arm replica ``replica`` so that its next poll raises outside any event."""
        sim = self.sim
        r = sim.replicas[replica]
        if r.op is not None or r.faults.armed is not None:
            return False
        sim._step("fail_next_poll", f"sim.fail_next_poll({replica}, {where!r})")
        sim._fault(f"poll-error-{where}")
        r.faults.arm(where)
        sim._after_step()
        return True

    def crash(self, replica: int) -> bool:
        """Replica ``replica``'s process dies mid-batch: its connection closes without commit."""
        sim = self.sim
        r = sim.replicas[replica]
        if r.op is not None or r.batch is None or r.zombie:
            return False
        sim._step("crash", f"sim.crash({replica})")
        sim._fault("crash")
        r.submit("crash", f"crash({replica})", partial(self.close_without_commit, r.batch),
                 partial(self.crashed, r, r.pid))
        sim._after_step()
        return True

    @staticmethod
    def close_without_commit(batch: Batch) -> None:
        """What a dying process does to its connection: closes it, never sending COMMIT."""
        connection = batch.session.connection()
        connection.invalidate()  # closes the DBAPI connection: no COMMIT is ever sent
        # the session's own close may fail on the invalidated connection; it holds nothing
        with contextlib.suppress(Exception):
            batch.session.close()

    def crashed(self, r: Replica, pid: int | None, _: Any, error: BaseException | None) -> None:
        sim = self.sim
        if error is not None:
            raise HarnessError(f"crashing {r.name} failed: {error!r}")
        if pid is not None:
            sim.observer.wait_gone(pid)
        sim.model.discard(r.index)
        r.dispatcher.take_calls()
        r.restart()

    def kill(self, replica: int) -> bool:
        """``pg_terminate_backend`` on replica ``replica``'s backend, from the observer's session."""
        sim = self.sim
        r = sim.replicas[replica]
        holding = r.op is None and r.batch is not None and not r.zombie
        if not (holding or r.op is not None) or r.pid is None:
            return False
        sim._step("kill", f"sim.kill({replica})")
        sim._fault("kill")
        r.killed = True
        sim.observer.terminate(r.pid)
        if holding:
            r.zombie = True
            r.killed = False
            sim.model.discard(replica)
        sim._after_step()
        return True

    def freeze(self, replica: int) -> bool:
        """Replica ``replica`` freezes mid-batch for longer than its idle-in-transaction
        timeout: its batch's transaction carries production's per-transaction bound
        (``set_local_settings``, as behind a transaction pooler, here 50 ms), the replica
        goes quiet, and the database itself ends the session, rolling the transaction back
        and releasing its locks. The replica does not know yet: it still holds its Batch and
        finds out at its next statement (SIM-11)."""
        sim = self.sim
        r = sim.replicas[replica]
        if r.op is not None or r.batch is None or r.zombie or r.pid is None:
            return False
        sim._step("freeze", f"sim.freeze({replica})")
        sim._fault("frozen-past-timeout")
        self.published_at_freeze[replica] = self.published(r)
        r.submit("freeze", f"freeze({replica})", partial(self.bound_idle, r.batch),
                 partial(self.frozen, r, r.pid))
        sim._after_step()
        return True

    @staticmethod
    def bound_idle(batch: Batch) -> None:
        timeouts = {"statement": "0", "lock": "0", "idle": str(FREEZE_TIMEOUT_MS), "zone": SESSION_TIME_ZONE,
                    "search_path": None}
        batch.session.execute(Statements.of()["set_local_settings"], timeouts)  # names no table

    def frozen(self, r: Replica, pid: int, _: Any, error: BaseException | None) -> None:
        sim = self.sim
        if error is not None:
            raise HarnessError(f"bounding {r.name}'s idle time failed: {error!r}")
        sim.observer.wait_gone(pid)  # the server ends the idle session by itself
        sim._check("SIM-11")
        r.zombie = True
        sim.model.discard(r.index)

    @staticmethod
    def published(r: Replica) -> int:
        publisher = r.scheduler.publisher
        return len(publisher.messages) if isinstance(publisher, RecordingPublisher) else 0

    def check_nothing_published(self, r: Replica) -> None:
        """SIM-11: a frozen replica's batch, failed on resuming, pushed nothing."""
        before = self.published_at_freeze.pop(r.index, None)
        if before is None:
            return
        self.sim._check("SIM-11")
        if self.published(r) != before:
            raise self.sim.fail("SIM-11", f"{r.name} published notifications of the batch the database "
                                          "ended while it was frozen")
