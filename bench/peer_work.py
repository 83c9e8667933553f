"""The handler a pgqueuer or procrastinate user would write for a reminder.

Our full path deduplicates, applies preferences and the daily cap, and writes a
notification with its delivery row, in the batch's transaction. Comparing it with peers
that run a no-op handler measures the queue, not the work; so the peers also run this
handler: in its own transaction on the worker's own connection, it

1. claims the job's deduplication key (``INSERT ... ON CONFLICT DO NOTHING``): a key seen
   before makes the job a duplicate, and nothing else is written;
2. inserts the notification;
3. inserts its delivery row.

Three statements and a commit per job, the least a handler can do and still be exact
about duplicates. (Ours reads preferences and the day's count in the dedup statement;
these peers do not, so the comparison leans their way.) The tables are the handler's,
created beside the peer's own schema in the peer's fresh database.
"""

from __future__ import annotations

import asyncio
from typing import Any

# pgqueuer runs up to a batch of jobs at once in a worker: its handler's pool.
PGQUEUER_POOL = 4

HANDLER_SCHEMA = """
CREATE TABLE IF NOT EXISTS peer_dedup_keys (
    key text PRIMARY KEY,
    claimed_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS peer_notifications (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id text NOT NULL,
    title text NOT NULL,
    body text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS peer_deliveries (
    notification_id bigint NOT NULL REFERENCES peer_notifications (id),
    channel text NOT NULL,
    status text NOT NULL
);
"""

CLAIM_KEY = "INSERT INTO peer_dedup_keys (key) VALUES (%s) ON CONFLICT DO NOTHING RETURNING key"
INSERT_NOTIFICATION = ("INSERT INTO peer_notifications (user_id, title, body) VALUES (%s, %s, %s) "
                       "RETURNING id")
INSERT_DELIVERY = "INSERT INTO peer_deliveries (notification_id, channel, status) VALUES (%s, 'push', 'sent')"

HANDLERS = ("noop", "work")


def job_key(n: int) -> str:
    """The deduplication key of the ``n``-th job (one reminder per participant and day)."""
    return f"commitment_reminder:user-{n}:2026-11-30"


async def create_schema(conninfo: str) -> None:
    """The handler's tables in the peer's database."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(HANDLER_SCHEMA)


class Pool:
    """The worker's own connections for its handler: a user's application pool.

    pgqueuer runs a batch's jobs as concurrent tasks, so a handler borrows a connection
    for its transaction and gives it back; procrastinate (concurrency 1) needs one.
    """

    def __init__(self, connections: list[Any]) -> None:
        self._all = connections
        self._free: asyncio.Queue[Any] = asyncio.Queue()
        for conn in connections:
            self._free.put_nowait(conn)

    async def store_notification(self, n: int) -> bool:
        conn = await self._free.get()
        try:
            return await store_notification(conn, n)
        finally:
            self._free.put_nowait(conn)

    async def close(self) -> None:
        for conn in self._all:
            await conn.close()


async def connect(conninfo: str, size: int = 1) -> Pool:
    """A pool of ``size`` autocommit connections for the handler."""
    import psycopg

    return Pool([await psycopg.AsyncConnection.connect(conninfo, autocommit=True) for _ in range(size)])


async def store_notification(conn: Any, n: int) -> bool:
    """The handler's work for job ``n`` in one transaction on ``conn``; False when it was a duplicate."""
    async with conn.transaction():
        claimed = await (await conn.execute(CLAIM_KEY, (job_key(n),))).fetchone()
        if claimed is None:
            return False
        row = await (await conn.execute(INSERT_NOTIFICATION, (
            f"user-{n}", "Reminder: run the dishwasher at noon", "You said you would run it at noon."))).fetchone()
        await conn.execute(INSERT_DELIVERY, (row[0],))
    return True


def counts(conninfo: str) -> dict[str, int]:
    """How many keys, notifications and deliveries the handler wrote (the run's proof)."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        out: dict[str, int] = {}
        for table in ("peer_dedup_keys", "peer_notifications", "peer_deliveries"):
            row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            out[table] = int(row[0]) if row else 0
    return out
