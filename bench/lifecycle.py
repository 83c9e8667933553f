"""Benchmark: what the history trigger costs the dispatch hot path (issue 10).

Migration 0003 appends a history row, by trigger, to every INSERT and UPDATE of
``scheduled_events``: the loop's ``mark_dispatched`` and ``mark_failed`` included. The
claim is a ``SELECT ... FOR UPDATE`` and fires no trigger. This drains the same backlog
with the trigger enabled and disabled (``ALTER TABLE ... DISABLE TRIGGER``), in one
process with production's ``Scheduler.poll_once`` back to back, alternating the two
several times so that load from elsewhere on the machine falls on both alike; the best
rate of each counts. Two dispatchers: a no-op (the queue's own cost, where the trigger
weighs most) and the real ``NudgingPlatform`` (what a poll really costs).
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, text

from bench.drain import noop_dispatcher
from bench.env import NOW, Server, bench_engine, load_events, progress
from scheduler.clock import ManualClock
from scheduler.db import make_sessionmaker
from scheduler.dispatch import NudgingPlatform
from scheduler.loop import Scheduler
from scheduler.rules import load_catalogue
from scheduler.types import Dispatcher

TRIGGER = "tr_scheduled_events_history"


def _drain_once(engine: Engine, dispatcher: Dispatcher, events: int, batch: int) -> float:
    """Drain ``events`` due rows with one Scheduler; events per second."""
    scheduler = Scheduler(make_sessionmaker(engine), dispatcher, ManualClock(NOW), batch_size=batch)
    started = time.perf_counter()
    done = 0
    while True:
        report = scheduler.poll_once()
        if report.claimed == 0:
            break
        done += report.claimed
    elapsed = time.perf_counter() - started
    if done != events:
        raise RuntimeError(f"drained {done} events, expected {events}")
    return events / elapsed


def _reload(engine: Engine, events: int, trigger_on: bool, round_: int) -> None:
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE scheduled_events, scheduled_event_history, notifications, deliveries, dedup_keys"))
        conn.execute(text(f"ALTER TABLE scheduled_events {'ENABLE' if trigger_on else 'DISABLE'} TRIGGER {TRIGGER}"))
    load_events(engine, pending=events, prefix=f"r{round_}-user-")


def run(server: Server, *, events: int, rounds: int, batch: int = 20) -> dict[str, Any]:
    """Events/s with and without the history trigger, no-op and full dispatch path."""
    results: dict[str, Any] = {"events": events, "batch_size": batch, "rounds": rounds, "kinds": {}}
    catalogue = load_catalogue(None)
    dispatchers: dict[str, Dispatcher] = {"noop": noop_dispatcher, "full": NudgingPlatform(catalogue)}
    with server.fresh_database("history") as url:
        engine = bench_engine(url)
        try:
            for kind, dispatcher in dispatchers.items():
                rates: dict[str, list[float]] = {"with_history": [], "without_history": []}
                for round_ in range(rounds):
                    for label, on in (("with_history", True), ("without_history", False)):
                        _reload(engine, events, on, round_)
                        rate = _drain_once(engine, dispatcher, events, batch)
                        rates[label].append(rate)
                        progress(f"history: {kind} {label.replace('_', ' ')}: {rate:,.0f} events/s")
                best = {label: max(values) for label, values in rates.items()}
                results["kinds"][kind] = {
                    "events_per_second": rates,
                    "best": best,
                    "cost_per_event_us": (1 / best["with_history"] - 1 / best["without_history"]) * 1e6,
                    "slowdown": best["without_history"] / best["with_history"],
                }
                progress(f"history: {kind}: best {best['with_history']:,.0f} events/s with the trigger, "
                         f"{best['without_history']:,.0f} without "
                         f"({results['kinds'][kind]['cost_per_event_us']:.0f} us per event)")
        finally:
            engine.dispose()
    return results
