"""What the step modules may use of a run: a narrow interface, not the ``Simulation``.

``posts``, ``phases``, ``run_steps``, ``replica_faults``, ``oracle`` and ``teardown`` each
take a ``RunContext``; ``Simulation`` is one (checked by mypy where it hands itself over).
So the steps never import ``harness.simulation``, and the harness has no import cycle,
not even under ``TYPE_CHECKING``. The underscored members are the run's bookkeeping,
shared by the steps and by nothing outside the harness.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from harness.actors import Actor, Client, Replica, Stats
from harness.broken import Variant
from harness.host import Expected, HostDispatcher
from harness.model import Call, Model
from harness.observer import Observer
from harness.probe import RollbackProbe
from scheduler.core.loop import EventOutcome
from scheduler.types import DigitalTwinEvent


class ClockChecks(Protocol):
    """The SIM-10 checks the phase and run steps make of a replica's clock (``clocks.ClockFaults``)."""

    def check_not_early(self, r: Replica, event_ids: list[str]) -> None: ...

    def check_claim_time(self, r: Replica, claimed_at: datetime | None) -> None: ...

    def check_recorded_time(self, r: Replica, outcome: EventOutcome, at: datetime | None = None) -> None: ...


class Violation(AssertionError):
    """An invariant of specs/simulation.md does not hold."""

    def __init__(self, clause: str, message: str, step: int = 0) -> None:
        super().__init__(f"{clause} violated at step {step}: {message}")
        self.clause = clause
        self.message = message
        self.step = step


class RunContext(Protocol):
    """The run as its steps see it: its actors, model, observer and bookkeeping."""

    seed: int
    start: datetime
    participants: int
    batch_size: int
    versions: int  # posts so far (each post is a new version of its row's content)
    caps: dict[str, int]
    model: Model
    observer: Observer
    replicas: list[Replica]
    clients: list[Client]
    stats: Stats
    variant: Variant
    host: HostDispatcher | None  # None: the built-in platform
    probe: RollbackProbe | None  # what a dispatch rolled back on purpose left (a host's run)
    event_faults: tuple[str, ...]  # the faults an event may carry with this dispatcher

    def expect(self, event: DigitalTwinEvent) -> Expected | None:
        """The host's expectation of an event (None for the built-in platform)."""
        ...

    def _check_expected(self, r: Replica, event_id: str, status: str, error: str | None) -> None:
        """SIM-4 for a host: the event ended as the host (and its fault) said it would."""
        ...

    @property
    def actors(self) -> list[Actor]: ...

    @property
    def clock_faults(self) -> ClockChecks:
        """The per-replica host clocks' checks (SIM-10)."""
        ...

    def now(self) -> datetime: ...

    def fail(self, clause: str, message: str) -> Violation:
        """The violation of ``clause`` at this step (the run's first is kept)."""
        ...

    def free_clients(self) -> list[int]: ...

    def requesting_clients(self) -> list[int]: ...

    # -- a step's bookkeeping ---------------------------------------------------------------

    def _step(self, kind: str, code: str) -> None: ...

    def _after_step(self) -> None: ...

    def _settle(self) -> None: ...

    def _fault(self, kind: str) -> None: ...

    def _check(self, clause: str) -> None: ...

    # -- what the phase and run steps share -------------------------------------------------

    def _row_has_waiting_writer(self, key: str | None, event_id: str | None) -> bool: ...

    def _a_claim_waits(self) -> bool: ...

    def _claim_blocked(self, r: Replica, lock: str) -> None: ...

    def _show(self, ids: list[str]) -> str: ...

    def _poll_failed(self, r: Replica) -> None: ...

    def _call(self, r: Replica, raw: dict[str, Any]) -> Call: ...

    def _check_stopped(self, r: Replica) -> None: ...

    def _check_loop_survived(self, r: Replica, needle: str) -> None: ...
