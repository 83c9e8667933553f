"""Where a replica's time goes: cProfile over one no-op drain, and statements per event.

This is the evidence behind the mechanics ratio: it splits a replica's time into waiting
on PostgreSQL (psycopg's ``execute``), SQLAlchemy's own work, and the loop's, and counts
the statements the loop sends per batch, against the ceiling's ``1 + batch`` statements.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import re
import time
from typing import Any

from sqlalchemy import event

from bench.drain import make_scheduler
from bench.env import Server, bench_engine, load_events, progress

# Functions whose cumulative time is reported (substring of "file:function").
BUCKETS = {
    "psycopg execute (round trips)": "psycopg/cursor.py:execute",
    "SQLAlchemy Session.execute": "orm/session.py:execute",
    "savepoint begin_nested": "orm/session.py:begin_nested",
    "commits (SQLAlchemy's; after a COMMIT statement nothing is sent)": "orm/session.py:commit",
    "statements sent together (one message)": "scheduler/database/pipeline.py:send",
    "Scheduler.claim": "scheduler/core/loop.py:claim",
    "Scheduler.dispatch_next": "scheduler/core/loop.py:dispatch_next",
    "Scheduler.finish": "scheduler/core/loop.py:finish",
    "engine evaluate (rules, templates)": "scheduler/nudging/rules.py:evaluate",
    "the one decision (a batch, or a live event as a batch of one)": "scheduler/nudging/decision.py:decide",
}


def run(server: Server, *, events: int, batch: int = 20, kind: str = "ours") -> dict[str, Any]:
    """Profile one replica draining ``events`` rows (``kind``: ``ours`` no-op, ``full`` platform)."""
    with server.fresh_database("profile") as url:
        engine = bench_engine(url, pool_size=1, max_overflow=0)
        try:
            load_events(engine, pending=events)
            statements: list[str] = []

            @event.listens_for(engine, "before_cursor_execute")
            def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
                body = " ".join(line.split("--", 1)[0] for line in statement.splitlines()).split()
                words = [w.upper() for w in body[:3]]
                if words and words[0] == "COMMIT":
                    return  # the set-based write's COMMIT travels as a statement; not counted, as before
                if words and words[0] in ("SAVEPOINT", "RELEASE", "ROLLBACK"):
                    words = words[:1] if words[0] == "SAVEPOINT" else words[:2]
                elif words and words[0] == "SELECT":
                    if "pg_advisory" in statement:
                        words = ["SELECT", "pg_advisory_xact_lock"]
                    else:
                        tables = re.findall(r"\bFROM\s+(\w+)", statement, re.I)
                        words = ["SELECT", tables[0] if tables else "?"]
                elif words and words[0] in ("INSERT", "UPDATE"):
                    target = re.search(r"^\s*(?:INSERT\s+INTO|UPDATE)\s+(\w+)", " ".join(body), re.I)
                    words = [words[0], target[1] if target else "?"]
                statements.append(" ".join(words[:2]))

            scheduler = make_scheduler(engine, kind, batch)
            profiler = cProfile.Profile()
            started = time.perf_counter()
            profiler.enable()
            dispatched = 0
            polls = 0
            while True:
                report = scheduler.poll_once()
                polls += 1
                dispatched += report.dispatched
                if report.claimed == 0:
                    break
            profiler.disable()
            elapsed = time.perf_counter() - started
        finally:
            engine.dispose()
    stats = pstats.Stats(profiler)
    total = elapsed
    buckets: dict[str, float] = {}
    for (filename, _line, function), (_cc, _nc, _tt, cumulative, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        key = f"{filename}:{function}"
        for label, pattern in BUCKETS.items():
            if key.endswith(pattern) or pattern in key:
                buckets[label] = buckets.get(label, 0.0) + cumulative
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
    kinds: dict[str, int] = {}
    for s in statements:
        kinds[s] = kinds.get(s, 0) + 1
    shares = {label: seconds / total for label, seconds in buckets.items()}
    result: dict[str, Any] = {
        "dispatcher": "NudgingPlatform" if kind == "full" else "no-op",
        "events": dispatched, "polls": polls, "batch_size": batch, "seconds": elapsed,
        "events_per_second": dispatched / elapsed,
        "share_of_time": shares,
        # psycopg sends BEGIN itself and COMMIT is a protocol call: neither is counted here.
        "statements_per_event": len(statements) / max(dispatched, 1),
        "statements_by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        "top_tottime": text.getvalue().splitlines()[:45],
        "note": "cProfile slows Python down, so its shares overstate Python against the database",
    }
    progress(f"profile ({result['dispatcher']}): {dispatched:,} events under cProfile, "
             f"{result['statements_per_event']:.2f} statements "
             f"per event; psycopg execute {shares.get('psycopg execute (round trips)', 0):.0%} "
             f"of the time")
    return result
