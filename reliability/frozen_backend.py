"""What a frozen replica's backend holds, read from PostgreSQL's view of that backend.

The partition scenario freezes a replica mid-batch and must know whether the freeze landed
inside the batch's transaction: ``pg_stat_activity`` tells the backend's state and its
transaction id, ``pg_locks`` its advisory locks, and the rows' ``xmax`` which pending rows
that open transaction holds (REL-16). Nothing here guesses from what a row remembers alone.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, text

from scheduler.core.participant_locks import participant_lock_key


def between_round_trips(engine: Engine, name: str) -> int | None:
    """The victim's backend inside a transaction that holds locks (it has a transaction id)
    and waiting for its client between two round trips (the claim answered, the replica
    deciding the batch), if any: the moment to freeze it."""
    with engine.connect() as conn:
        pid = conn.execute(text(
            "SELECT pid FROM pg_stat_activity WHERE application_name = :name "
            "AND backend_xid IS NOT NULL AND state = 'idle in transaction' LIMIT 1"), {"name": name}).scalar()
    return int(pid) if pid is not None else None


def waits_on_client(engine: Engine, pid: int) -> bool:
    """The backend runs nothing the client sent: it waits for the client (or is gone)."""
    with engine.connect() as conn:
        state = conn.execute(text("SELECT state FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}).scalar()
    return state != "active"


def backend_state(engine: Engine, pid: int) -> dict[str, Any] | None:
    """What pg_stat_activity says of a backend (a scenario's error shows it)."""
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT state, wait_event_type, wait_event, backend_xid::text AS xid, left(query, 300) AS query, "
            "now() - state_change AS in_state_for FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}).first()
    return dict(row._mapping) if row else None


def frozen_batch(engine: Engine, name: str) -> tuple[int, list[str], list[str]] | None:
    """What a frozen replica's own backends hold, read from their state, never guessed from
    what a row remembers: the backend of ``name`` that sits ``idle in transaction`` with a
    transaction id, its batch (the pending rows whose xmax is that transaction, still in
    progress, so their locks are its own) and the other pending rows of the participants
    whose advisory locks it holds (pg_locks), which every other replica's claim skips.

    None when no backend of the replica sits in a transaction holding a pending row: the
    batch had committed (or not begun) when the freeze landed. A committed batch leaves its
    xid in the xmax of every row it locked and left pending (a busy participant's rows), so
    xmax alone would count rows nobody holds, in a session the database never ends."""
    with engine.connect() as conn:
        # One statement, so the backend's state, its locks and the rows are read together.
        rows = conn.execute(text(
            "WITH frozen AS ("
            "  SELECT a.pid, a.backend_xid::text AS xid,"
            "         ARRAY(SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks l"
            "               WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted"
            "                 AND l.objsubid = 1) AS keys"
            "  FROM pg_stat_activity a"
            "  WHERE a.application_name = :name AND a.state = 'idle in transaction'"
            "    AND a.backend_xid IS NOT NULL) "
            "SELECT f.pid, f.keys, e.id, e.user_id, e.xmax::text = f.xid AS locked "
            "FROM frozen f JOIN scheduled_events e ON e.status = 'pending' "
            "ORDER BY f.pid, e.id"), {"name": name}).all()
    for pid in dict.fromkeys(r.pid for r in rows):
        mine = [r for r in rows if r.pid == pid]
        batch = [r.id for r in mine if r.locked]
        if not batch:
            continue
        keys = set(mine[0].keys)
        participants = [r.id for r in mine if not r.locked and participant_lock_key(r.user_id) in keys]
        return int(pid), batch, participants
    return None
