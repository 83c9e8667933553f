"""Settling: after each step, wait until every actor has finished or waits on a lock.

A step hands work to actor threads (a claim, a post, a commit). Before the harness may
check anything or choose the next step, each of those must have either finished (its
result is then processed, in a fixed order) or be seen blocked in ``pg_locks`` behind
another of our actors that cannot move by itself. Anything else is timing, and a seed
would not replay. A wait cycle is PostgreSQL's to break (deadlock_timeout), so settling
waits for its verdict.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import wait as wait_futures

from harness.actors import Actor, Stats
from harness.observer import StateObserver

SETTLE_TIMEOUT = 60.0


class HarnessError(RuntimeError):
    """The harness itself cannot go on (an actor neither finishes nor waits on a lock)."""


def has_cycle(graph: dict[int, list[int]]) -> bool:
    """True when the wait-for graph (pid -> the pids it waits for) has a cycle."""
    seen: set[int] = set()
    return any(_reaches_a_cycle(graph, pid, frozenset(), seen) for pid in graph)


def _reaches_a_cycle(graph: dict[int, list[int]], node: int, path: frozenset[int], seen: set[int]) -> bool:
    """Depth first from ``node``: True when a node on ``path`` is met again."""
    if node in path:
        return True
    if node in seen:
        return False
    seen.add(node)
    return any(_reaches_a_cycle(graph, n, path | {node}, seen) for n in graph.get(node, []))


class Settler:
    """Waits for the actors of one run, through the observer's view of PostgreSQL's locks."""

    def __init__(self, actors: Callable[[], list[Actor]], observer: StateObserver, stats: Stats,
                 timeout: float = SETTLE_TIMEOUT) -> None:
        self.actors = actors
        self.observer = observer
        self.stats = stats
        self.timeout = timeout

    def settle(self) -> None:
        """Wait until every actor has finished or waits on a lock; process what finished."""
        deadline = time.monotonic() + self.timeout
        while True:
            busy = [a for a in self.actors() if a.op is not None]
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
            wait_futures([a.op.future for a in busy if a.op], timeout=self.timeout,
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
                                   f"within {self.timeout:g}s")
            wait_futures([op.future], timeout=0.002)
        return True

    def _stably_blocked(self, a: Actor) -> bool:
        """A wait counts only when every blocker is one of our actors that cannot move by
        itself (idle in its transaction, or waiting too). A wait on anything else (autovacuum,
        a relation-extension lock of a backend that is running) ends by itself, so stopping
        there would let timing decide the next step and a seed would not replay."""
        blockers = self.observer.blockers([a.pid] if a.pid else []).get(a.pid or 0, [])
        ours = {x.pid for x in self.actors() if x.pid}
        if not blockers or not set(blockers) <= ours:
            return False
        return self.observer.stuck(blockers) == set(blockers)

    @staticmethod
    def _complete(a: Actor) -> None:
        op = a.op
        assert op is not None
        a.op = None
        error = op.future.exception()
        op.on_done(None if error is not None else op.future.result(), error)

    def _wait_cycle(self, busy: list[Actor]) -> bool:
        pids = {a.pid for a in busy if a.pid}
        graph = {pid: [b for b in blockers if b in pids] for pid, blockers in self.observer.blockers(pids).items()}
        return has_cycle(graph)
