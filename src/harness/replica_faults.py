"""Faults a step does to a replica: a poll armed to fail, a process crash, a killed backend.

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


class ReplicaFaults:
    """The ``fail_next_poll``, ``crash`` and ``kill`` steps of one run."""

    def __init__(self, sim: RunContext) -> None:
        self.sim = sim

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
