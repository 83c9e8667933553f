"""What ``ix_scheduled_events_user_id`` (PERF-5) costs a write: ``python -m bench.participant_index``.

Loads a table as ``bench scale`` does (``--rows``, default 1,000,000), then times
production's upsert of a new event and ``record_outcomes`` for a batch of 20 pending rows,
each in a savepoint rolled back, in alternating rounds with the index present and dropped
(the drop is rolled back at the end of its round). Prints the medians; the database is
dropped afterwards. See docs/performance.md, "Scale: 10M rows".
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, text

from bench.env import DAY, NOW, Server, bench_engine, progress
from bench.scale import _load
from scheduler.database.queries import Statements

# the benchmarks' and scenarios' databases are in the default schema
STATEMENTS = Statements.of()

ROUNDS = 15
PER_ROUND = 20


def _timed(conn: Connection, name: str, params: dict[str, Any]) -> float:
    savepoint = conn.begin_nested()
    started = time.perf_counter()
    conn.execute(STATEMENTS[name], params)
    elapsed = (time.perf_counter() - started) * 1000
    savepoint.rollback()
    return elapsed


def measure(conn: Connection) -> dict[str, dict[str, float]]:
    """Median ms of a store and of a batch's outcomes, with and without the participant index."""
    facts = json.dumps({"facts_version": "1", "scenario": "commitment_reminder", "commitment": "x", "date": DAY})
    pending = text("SELECT id FROM scheduler.scheduled_events WHERE status = 'pending' LIMIT 20")
    ids = [r[0] for r in conn.execute(pending)]
    conn.rollback()
    times: dict[str, dict[str, list[float]]] = {
        kind: {"store": [], "outcome": []} for kind in ("with index", "without index")}
    for _ in range(ROUNDS):
        for kind in times:
            with conn.begin() as transaction:
                if kind == "without index":
                    conn.execute(text("DROP INDEX ix_scheduled_events_user_id"))
                for n in range(PER_ROUND):
                    times[kind]["store"].append(_timed(conn, "upsert_event_by_key", {
                        "id": f"new-{n}", "event_type": "commitment", "user_id": f"user-{n}", "community_id": None,
                        "external_key": f"key-{n}", "trigger_at": NOW + timedelta(days=1), "facts": facts,
                        "now": NOW, "traceparent": None, "expires_at": None}))
                    times[kind]["outcome"].append(_timed(conn, "record_outcomes", {
                        "ids": ids, "statuses": ["dispatched"] * len(ids), "errors": [None] * len(ids),
                        "times": [NOW] * len(ids), "not_befores": [None] * len(ids)}))
                transaction.rollback()  # the index is back
    return {kind: {what: statistics.median(v) for what, v in t.items()} for kind, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.participant_index", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="table size (default 1,000,000)")
    parser.add_argument("--database-url", default=None, help="as for python -m bench")
    args = parser.parse_args()
    logging.getLogger("alembic").setLevel(logging.WARNING)
    server = Server(args.database_url)
    with server.fresh_database("participant_index") as url:
        engine = bench_engine(url)
        try:
            _load(engine, args.rows)
            with engine.connect() as conn:
                result = measure(conn)
        finally:
            engine.dispose()
    for kind, figures in result.items():
        progress(f"{kind}: store {figures['store']:.3f} ms, outcomes of 20 rows {figures['outcome']:.3f} ms "
                 f"(medians of {ROUNDS * PER_ROUND})")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
