"""The seeded random driver for long soak runs: one seed drives every choice.

``random_step`` picks one applicable step with ``random.Random(seed)``; the simulation's
row ids derive from the same seed, so a seed replays the same run. On a violation the
driver reports the seed, the replay command and the program that led there, and can write
that program out as an ordinary pytest regression test.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TextIO

from harness.host import source_of
from harness.simulation import Simulation
from harness.types import Violation

FAULTS = ("event-errors", "poll-errors", "crash", "kill", "stop", "clock", "skew", "freeze")
# Opt-in draws, named like faults but not in ``all``: adding one to ``all`` would change every
# seeded program (their random streams) that the suite pins. "expiry": some posts carry a window.
OPT_IN = ("expiry",)

Step = tuple[int, str, Callable[[], bool]]


def _choices(sim: Simulation, rng: random.Random, faults: frozenset[str]) -> list[Step]:
    steps: list[Step] = []

    def add(weight: int, name: str, fn: Callable[[], bool]) -> None:
        steps.append((weight, name, fn))

    def content(retry: bool = False) -> tuple[int, int, str | None, int, str | None, int | None]:
        fault = None
        if "event-errors" in faults and rng.random() < 0.15:
            fault = rng.choice(sim.event_faults)  # the built-in's, or a host's (harness.host)
        # keys are reused (re-posts) and new ones keep coming (first posts of a key)
        key = f"k{rng.randrange(sim.versions // 8 + 4)}" if rng.random() < 0.6 else None
        in_flight = [c.request.key for c in sim.clients if c.request is not None and c.request.key]
        if retry and in_flight and rng.random() < 0.5:
            key = rng.choice(in_flight)  # a sender retrying while its first request is in flight
        user, trigger, day = rng.randrange(sim.participants), rng.randint(-30, 20), rng.randrange(4)
        # "expiry": some posts carry an expires_at a few minutes after their trigger (EXP-1)
        window = rng.choice((1, 5, 15)) if "expiry" in faults and rng.random() < 0.4 else None
        return user, trigger, key, day, fault, window

    if sim.free_clients():
        add(14, "post", partial(sim.post, *content()))
        add(3, "begin_post", partial(sim.begin_post, rng.choice(sim.free_clients()), *content(retry=True)))
        add(1, "reset", partial(sim.reset, rng.randrange(1000)))
        add(1, "cancel", partial(sim.cancel, rng.randrange(1000)))
    for c in sim.requesting_clients():
        add(4, "end_post", partial(sim.end_post, c))
    add(6, "advance", partial(sim.advance, rng.choice((1, 2, 5, 10, 30))))
    if "clock" in faults:
        add(1, "advance", partial(sim.advance, rng.choice((-90, -20, 24 * 60))))
    for r in sim.idle_replicas():
        add(8, "claim", partial(sim.claim, r))
        stop_after = None
        if "stop" in faults and rng.random() < 0.3:
            stop_after = rng.randint(1, max(1, sim.batch_size // 2))
        add(4, "run", partial(sim.run, r, stop_after))
    for r in sim.holding_replicas():
        add(16, "dispatch", partial(sim.dispatch, r))
        add(5, "finish", partial(sim.finish, r))
    for r in sim.live_holding_replicas():
        if "crash" in faults:
            add(1, "crash", partial(sim.crash, r))
        if "stop" in faults:
            add(1, "stop", partial(sim.stop, r))
        if "kill" in faults:
            add(1, "kill", partial(sim.kill, r))
        if "freeze" in faults:
            add(1, "freeze", partial(sim.freeze, r))
    if "kill" in faults:
        for r in sim.busy_replicas():
            add(1, "kill", partial(sim.kill, r))
    if "skew" in faults:
        for r in sim.idle_replicas():
            add(1, "skew_clock", partial(sim.skew_clock, r, rng.choice((-60, -5, 0, 5, 60))))
    if "poll-errors" in faults:
        add(1, "fail_next_poll", partial(sim.fail_next_poll, rng.randrange(len(sim.replicas)),
                                         rng.choice(("claim", "commit"))))
    return steps


def random_step(sim: Simulation, rng: random.Random, faults: frozenset[str]) -> bool:
    """Take one applicable step chosen by ``rng``; False if nothing applied."""
    steps = _choices(sim, rng, faults)
    total = sum(w for w, _, _ in steps)
    pick = rng.uniform(0, total)
    for weight, _name, fn in steps:
        pick -= weight
        if pick <= 0:
            return fn()
    return steps[-1][2]()


@dataclass
class Progress:
    """A progress line on stderr: a bar on a terminal, a line every tenth otherwise."""

    total: int
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    started: float = field(default_factory=time.monotonic)
    last: float = 0.0
    last_tenth: int = -1

    def update(self, done: int, sim: Simulation) -> None:
        now = time.monotonic()
        tty = self.stream.isatty()
        tenth = done * 10 // max(self.total, 1)
        if tty and now - self.last < 0.2 and done < self.total:
            return
        if not tty and tenth == self.last_tenth and done < self.total:
            return
        self.last, self.last_tenth = now, tenth
        elapsed = max(now - self.started, 1e-9)
        width = 30
        filled = width * done // max(self.total, 1)
        counts = sim.model.committed_counts()
        line = (f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} steps "
                f"{done / elapsed:6.1f} steps/s  dispatched {counts['dispatched']} failed {counts['failed']} "
                f"checks {sum(sim.stats.checks.values())}")
        self.stream.write(("\r" + line) if tty else (line + "\n"))
        if tty and done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def run_random(sim: Simulation, steps: int, rng: random.Random, faults: frozenset[str],
               progress: Progress | None = None, drain: bool = True) -> None:
    """``steps`` random steps, then (unless ``drain`` is False) the drain and its final equality."""
    taken = 0
    attempts = 0
    while taken < steps:
        attempts += 1
        if random_step(sim, rng, faults):
            taken += 1
            if progress is not None:
                progress.update(taken, sim)
        if attempts > steps * 20:
            raise RuntimeError("the random driver found no applicable step")
    if drain:
        sim.drain()


def regression_source(sim: Simulation, violation: Violation, replay: str, *, name: str,
                      replicas: int, clients: int, batch_size: int, scheduler: str,
                      modes: str = "literal", program: list[str] | None = None,
                      participants: int | None = None) -> str:
    """The failing program (``program``, else the run's whole one) as an ordinary pytest test.

    It takes the ``scheduler_database_url`` fixture, which the pytest plugin shipped in the
    wheel provides (``harness.pytest_plugin``), so it runs in a host's suite as in this one.
    """
    lines = sim.program if program is None else program
    body = "\n".join(f"            {line}" for line in lines)
    host = source_of(sim.host)
    imports = "from harness import Simulation, Violation, load_host" if sim.host is not None \
        else "from harness import Simulation, Violation"
    extra = f", participants={participants}" if participants is not None else ""
    return f'''"""Found by `{replay}`.

{violation.clause}: {violation.message}
"""

import pytest

{imports}


def test_{name}(scheduler_database_url: str) -> None:
    """Replays the program that broke {violation.clause}; it must now run clean."""
    with Simulation(scheduler_database_url, seed={sim.seed}, replicas={replicas}, clients={clients},
                    batch_size={batch_size}, scheduler={scheduler!r}, modes={modes!r}{extra},
                    host={host}) as sim:
        try:
{body}
            sim.drain()
        except Violation as violation:
            pytest.fail(str(violation))
'''


def write_regression(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path
