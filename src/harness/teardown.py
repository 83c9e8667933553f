"""Teardown: end a run whatever state it is in, leaving no backend, lock or thread behind.

Called after a violation as well as after a clean run, so any step may still be in flight,
any batch open, any backend blocked. Each ``suppress`` below covers a cleanup action whose
failure is expected in some of those states and must not hide the run's own outcome:

- terminating a blocked backend that has just ended by itself (``pg_terminate_backend`` on
  a pid that is gone);
- aborting a batch whose connection was killed or crashed (the rollback fails because the
  connection is already closed: PostgreSQL has rolled it back);
- closing a read-then-write request's session whose connection was killed;
- the final sweep's terminations, for the same reason as the first.

Nothing else is suppressed: a failure to shut an actor down or close the observer is a
harness bug and propagates.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import wait as wait_futures

from harness.actors import Replica
from harness.settle import SETTLE_TIMEOUT
from harness.types import RunContext
from scheduler.core.loop import Batch


def close_run(sim: RunContext) -> None:
    """Unblock and end every actor, then close every connection."""
    observer = getattr(sim, "observer", None)
    for a in sim.actors:
        if a.op is not None and a.pid and observer is not None:
            with contextlib.suppress(Exception):
                observer.terminate(a.pid)
    for a in sim.actors:
        if a.op is not None:
            wait_futures([a.op.future], timeout=SETTLE_TIMEOUT)
            future, a.op = a.op.future, None
            # an op that finished unprocessed (a violation stopped the processing) may
            # have opened a batch nobody else knows of
            result = future.result() if future.done() and future.exception() is None else None
            if isinstance(result, Batch) and isinstance(a, Replica):
                with contextlib.suppress(Exception):
                    a.scheduler.abort(result)
    for r in sim.replicas:
        if r.batch is not None:
            with contextlib.suppress(Exception):
                r.scheduler.abort(r.batch)
            r.batch = None
    for c in sim.clients:
        if c.request is not None and c.request.session is not None:
            with contextlib.suppress(Exception):
                c.request.session.close()
        c.request = None
    for a in sim.actors:
        a.shutdown()
    if observer is not None:
        # Whatever was missed above, no backend of this run outlives it.
        with contextlib.suppress(Exception):
            for pid in observer.alive({p for a in sim.actors for p in a.pids}):
                observer.terminate(pid)
    sim.replicas, sim.clients = [], []
    probe = getattr(sim, "probe", None)
    if probe is not None:
        probe.close()
    if observer is not None:
        observer.close()
