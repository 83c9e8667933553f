"""Shrinking a failing program: the fewest steps that still break the same invariant.

A run's program is a list of step calls (``sim.post(...)``, ``sim.claim(0)``...), each a line
of Python. A candidate program is replayed on a fresh ``Simulation`` with the run's seed and
parameters (the same database, emptied; a host's ``setup`` runs again), then drained; it
counts when it raises a ``Violation`` of the same clause. The search deletes chunks of
steps, halving the chunk size down to single steps (a greedy ddmin), within a budget of
replays and seconds, so a failure's report stays quick. A step that no longer applies
(its replica holds no batch any more, say) is skipped by the step itself, so every
candidate is a valid program.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from harness.settle import HarnessError
from harness.simulation import Simulation
from harness.types import Violation

MAX_REPLAYS = 150
MAX_SECONDS = 120.0


@dataclass
class Shrunk:
    """The shortest failing program found, the violation it raises, and what it cost."""

    program: list[str]
    violation: Violation
    replays: int
    seconds: float
    original_steps: int


def replay(make: Callable[[], Simulation], program: list[str]) -> Violation | None:
    """Run ``program`` then the drain on a fresh simulation; the violation it raises, if any."""
    with make() as sim:
        try:
            for line in program:
                eval(compile(line, "<program>", "eval"), {"sim": sim})  # the run's own step calls
            sim.drain()
        except Violation as violation:
            return violation
        except HarnessError:
            return None
    return None


def shrink(make: Callable[[], Simulation], program: list[str], clause: str, *,
           max_replays: int = MAX_REPLAYS, max_seconds: float = MAX_SECONDS) -> Shrunk | None:
    """The shortest program found that still violates ``clause``; None if even the whole
    program does not fail again that way (the failure did not replay)."""
    started = time.monotonic()
    replays = 0

    def fails(candidate: list[str]) -> Violation | None:
        nonlocal replays
        replays += 1
        found = replay(make, candidate)
        return found if found is not None and found.clause == clause else None

    current = list(program)
    violation = fails(current)
    if violation is None:
        return None
    chunk = max(1, len(current) // 2)
    while chunk >= 1:
        i = 0
        while i < len(current):
            if replays >= max_replays or time.monotonic() - started > max_seconds:
                return Shrunk(current, violation, replays, time.monotonic() - started, len(program))
            candidate = current[:i] + current[i + chunk:]
            found = fails(candidate)
            if found is not None:
                current, violation = candidate, found
            else:
                i += chunk
        if chunk == 1:
            break
        chunk //= 2
    return Shrunk(current, violation, replays, time.monotonic() - started, len(program))
