"""What steps are possible now: which replicas and clients are free for which step.

Both drivers ask before they choose a step (the random driver, ``driver.run_random``, and
the stateful machine of the tests), and the step modules ask before they start one. Two
waits are never started, because PostgreSQL, not the seed, would choose who goes first
(DEC-SIM-6): a second writer on a row another writer already waits for, and a claim while
another replica's step is still running. ``Simulation`` has these as methods (it mixes
``StepChoices`` in); the steps see them through ``harness.types.RunContext``.
"""

from __future__ import annotations

from harness.actors import Client, Replica
from harness.model import Model


class StepChoices:
    """The free actors of a run, by the step they are free for (mixed into ``Simulation``)."""

    replicas: list[Replica]
    clients: list[Client]
    model: Model

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
