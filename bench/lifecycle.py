"""Benchmark: what the history trigger costs the dispatch hot path.

Migration 0003 appends a history row, by trigger, to every INSERT and UPDATE of
``scheduled_events``: the loop's ``mark_dispatched`` and ``mark_failed`` included. The
claim is a ``SELECT ... FOR UPDATE`` and fires no trigger. This drains the same backlog
with the trigger enabled and disabled (``ALTER TABLE ... DISABLE TRIGGER``), in one
process with production's ``Scheduler.poll_once`` back to back, alternating the two
poll by poll, so that load from elsewhere on the machine falls on both alike; the median
per-event cost of the polls of each counts. Two dispatchers: a no-op (the queue's own cost, where the trigger
weighs most) and the real ``NudgingPlatform`` (what a poll really costs). Last, the
same way, the full path with and without the inbox's ``StreamPublisher`` (after each
batch's commit, one short transaction per delivered notification: its stream number and
the NOTIFY that wakes every replica's inbox).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from sqlalchemy import Engine, text

from bench.drain import noop_dispatcher
from bench.env import NOW, Server, bench_engine, load_events, progress
from scheduler.core.clock import ManualClock
from scheduler.core.loop import Scheduler
from scheduler.database.database import Database
from scheduler.nudging.decision import NudgingPlatform
from scheduler.nudging.rules import load_catalogue
from scheduler.types import Dispatcher
from scheduler.web.inbox.hub import StreamPublisher

TRIGGER = "tr_scheduled_events_history"


def _toggle(engine: Engine, on: bool) -> None:
    with engine.begin() as conn:
        conn.execute(text(f"ALTER TABLE scheduler.scheduled_events {'ENABLE' if on else 'DISABLE'} TRIGGER {TRIGGER}"))


def _interleaved(engine: Engine, dispatcher: Dispatcher, events: int, batch: int) -> dict[str, list[float]]:
    """Drain ``events`` due rows poll by poll, switching the trigger on and off between
    polls: per-event milliseconds of each poll, by label. Drift on a shared machine (other
    work, a growing table) then falls on both labels alike."""
    scheduler = Scheduler(Database(engine), dispatcher, ManualClock(NOW), batch_size=batch)
    samples: dict[str, list[float]] = {"with_history": [], "without_history": []}
    on = True
    done = 0
    while True:
        _toggle(engine, on)
        started = time.perf_counter()
        report = scheduler.poll_once()
        elapsed = time.perf_counter() - started
        if report.claimed == 0:
            break
        done += report.claimed
        samples["with_history" if on else "without_history"].append(elapsed * 1000 / report.claimed)
        on = not on
    if done != events:
        raise RuntimeError(f"drained {done} events, expected {events}")
    _toggle(engine, True)
    return samples


def _interleaved_stream(engine: Engine, events: int, batch: int) -> dict[str, list[float]]:
    """The full path poll by poll, alternately with the inbox's StreamPublisher (a stream
    number and a NOTIFY per delivered notification, after commit) and without a publisher."""
    sessions = Database(engine)
    dispatcher = NudgingPlatform(load_catalogue(None))
    streaming = Scheduler(sessions, dispatcher, ManualClock(NOW), batch_size=batch, publisher=StreamPublisher(sessions))
    silent = Scheduler(sessions, dispatcher, ManualClock(NOW), batch_size=batch)
    samples: dict[str, list[float]] = {"with_stream": [], "without_stream": []}
    on = True
    done = 0
    while True:
        started = time.perf_counter()
        report = (streaming if on else silent).poll_once()
        elapsed = time.perf_counter() - started
        if report.claimed == 0:
            break
        done += report.claimed
        samples["with_stream" if on else "without_stream"].append(elapsed * 1000 / report.claimed)
        on = not on
    if done != events:
        raise RuntimeError(f"drained {done} events, expected {events}")
    return samples


def run(server: Server, *, events: int, rounds: int, batch: int = 20) -> dict[str, Any]:
    """Per-event cost of a poll with and without the history trigger, no-op and full path."""
    results: dict[str, Any] = {"events": events, "batch_size": batch, "rounds": rounds, "kinds": {}}
    dispatchers: dict[str, Dispatcher] = {"noop": noop_dispatcher, "full": NudgingPlatform(load_catalogue(None))}
    with server.fresh_database("history") as url:
        engine = bench_engine(url)
        try:
            for kind, dispatcher in dispatchers.items():
                samples: dict[str, list[float]] = {"with_history": [], "without_history": []}
                for round_ in range(rounds):
                    load_events(engine, pending=events, prefix=f"{kind}{round_}-user-")
                    for label, values in _interleaved(engine, dispatcher, events, batch).items():
                        samples[label].extend(values)
                medians = {label: statistics.median(values) for label, values in samples.items()}
                entry = {
                    "polls": {label: len(values) for label, values in samples.items()},
                    "median_ms_per_event": medians,
                    "cost_per_event_us": (medians["with_history"] - medians["without_history"]) * 1000,
                    "slowdown": medians["with_history"] / medians["without_history"],
                }
                results["kinds"][kind] = entry
                progress(f"history: {kind}: median {medians['with_history'] * 1000:.0f} us per event with the "
                         f"trigger, {medians['without_history'] * 1000:.0f} us without "
                         f"(+{entry['cost_per_event_us']:.0f} us, {entry['slowdown']:.2f}x)")
            samples = {"with_stream": [], "without_stream": []}
            for round_ in range(rounds):
                load_events(engine, pending=events, prefix=f"stream{round_}-user-")
                for label, values in _interleaved_stream(engine, events, batch).items():
                    samples[label].extend(values)
            medians = {label: statistics.median(values) for label, values in samples.items()}
            results["stream"] = {
                "median_ms_per_event": medians,
                "cost_per_event_us": (medians["with_stream"] - medians["without_stream"]) * 1000,
                "ratio": medians["with_stream"] / medians["without_stream"],
            }
            progress(f"history: full path with the inbox stream publisher: median {medians['with_stream'] * 1000:.0f} "
                     f"us per event, {medians['without_stream'] * 1000:.0f} us without "
                     f"(+{results['stream']['cost_per_event_us']:.0f} us)")
        finally:
            engine.dispose()
    return results
