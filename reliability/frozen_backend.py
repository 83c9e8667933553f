"""What a frozen replica's backend holds, read from PostgreSQL's view of that backend and
from the kernel's view of its socket.

The partition scenario freezes a replica mid-batch and must know whether the freeze landed
inside the batch's transaction with nothing of the replica's still on its way (REL-16):
``pg_stat_activity`` tells the backend's state, what it waits for and its transaction id,
``pg_locks`` its advisory locks, the rows' ``xmax`` which pending rows that open transaction
holds, and the kernel (sock_diag) whether bytes the replica sent before it froze still wait
unread in the backend's socket. Nothing here guesses from what a row remembers alone, nor
from how long something took.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import Any

from sqlalchemy import Engine, text

from reliability.cluster import ScenarioError
from scheduler.database.events import participant_lock_key
from scheduler.database.queries import load_queries

# linux/sock_diag.h, linux/unix_diag.h, linux/netlink.h
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY = 4, 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_UDIAG_SHOW_RQLEN, _UNIX_DIAG_RQLEN = 0x10, 4
_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_REQUEST = struct.Struct("=BBHIII2I")  # unix_diag_req
_MESSAGE = struct.Struct("=BBBBI2I")  # unix_diag_msg


def _claim_marker() -> str:
    """The claim's first line of SQL (queries.sql's claim_due_events past its comments): what
    pg_stat_activity shows of a backend running the claim, or whose last statement it was
    (it shows only the first kilobyte of a statement)."""
    sql = load_queries()["claim_due_events"].sql
    return next(line.strip() for line in sql.splitlines() if line.strip() and not line.lstrip().startswith("--"))


def claim_behind_lock(engine: Engine, name: str) -> int | None:
    """The backend of replica ``name`` whose claim waits for a table lock (an operator's),
    if any: it has sent its claim and locked nothing yet."""
    marker = "%" + _claim_marker().replace("%", r"\%").replace("_", r"\_") + "%"
    with engine.connect() as conn:
        pid = conn.execute(text(
            "SELECT pid FROM pg_stat_activity WHERE application_name = :name AND state = 'active' "
            "AND wait_event_type = 'Lock' AND query LIKE :marker LIMIT 1"), {"name": name, "marker": marker}).scalar()
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


def unix_receive_queues() -> dict[int, int]:
    """Socket inode -> bytes received and not yet read, for every Unix socket of this network
    namespace (the kernel's sock_diag, as ``ss -x`` shows them)."""
    queues: dict[int, int] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as diag:
        request = _REQUEST.pack(socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, _UDIAG_SHOW_RQLEN, 0xFFFFFFFF, 0xFFFFFFFF)
        diag.sendall(_HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY,
                                  _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0) + request)
        while True:
            data = diag.recv(1 << 16)
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
                if kind == _NLMSG_DONE:
                    return queues
                if kind == _NLMSG_ERROR:
                    raise OSError(-struct.unpack_from("=i", data, offset + _HEADER.size)[0], "sock_diag refused")
                inode = _MESSAGE.unpack_from(data, offset + _HEADER.size)[4]
                attribute = offset + _HEADER.size + _MESSAGE.size
                while attribute + 4 <= offset + length:
                    size, kind = struct.unpack_from("=HH", data, attribute)
                    if size < 4:
                        break
                    if kind == _UNIX_DIAG_RQLEN:
                        queues[inode] = struct.unpack_from("=I", data, attribute + 4)[0]
                    attribute += (size + 3) & ~3
                offset += (length + 3) & ~3


def unread_bytes(pid: int) -> int | None:
    """Bytes waiting unread in the Unix sockets of process ``pid`` (a backend's connection
    to its client); None when the process has no Unix socket this can see (gone, or a TCP
    connection)."""
    inodes = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.append(int(link.removeprefix("socket:[").removesuffix("]")))
    except OSError:
        return None
    queues = unix_receive_queues()
    seen = [queues[inode] for inode in inodes if inode in queues]
    return sum(seen) if seen else None


def _stat(engine: Engine, pid: int) -> tuple[Any, ...] | None:
    with engine.connect() as conn:  # a transaction of its own: a fresh view of pg_stat_activity
        row = conn.execute(text(
            "SELECT state, wait_event, backend_xid::text, state_change FROM pg_stat_activity WHERE pid = :pid"),
            {"pid": pid}).first()
    return tuple(row) if row else None


def frozen_in_transaction(engine: Engine, pid: int) -> bool:
    """The backend sits inside an open transaction, blocked reading from its client, with
    nothing its client sent still unread: it will run nothing more until its client goes on,
    or until the idle-in-transaction timeout ends the session.

    Read as: pg_stat_activity (``idle in transaction``, a transaction id, waiting on
    ``ClientRead``), then the backend's socket (no unread byte), then pg_stat_activity again,
    unchanged. A backend takes bytes off its socket only after its wait on ``ClientRead``
    ended, and a whole message read moves it to ``active`` (a new ``state_change``): so
    whatever it read before the socket was seen empty shows in the second reading, and
    nothing arrives after it, the client being frozen."""
    before = _stat(engine, pid)
    if before is None or before[0] != "idle in transaction" or before[1] != "ClientRead" or before[2] is None:
        return False
    unread = unread_bytes(pid)
    if unread is None:
        raise ScenarioError(f"cannot see backend {pid}'s Unix socket (/proc/{pid}/fd and sock_diag): "
                            "the scenario reaches PostgreSQL over its Unix socket on this host")
    return unread == 0 and _stat(engine, pid) == before


def frozen_batch(engine: Engine, pid: int) -> tuple[list[str], list[str]] | None:
    """What the frozen backend ``pid`` holds inside its open transaction: its batch (the
    pending rows whose xmax is that transaction, still in progress, so their locks are its
    own) and the other pending rows of the participants whose advisory locks it holds
    (pg_locks), which every other replica's claim skips.

    None when the backend is not ``idle in transaction`` with a transaction id that a pending
    row carries: its batch had committed (or not begun). A committed batch leaves its xid in
    the xmax of every row it locked and left pending (a busy participant's rows), so xmax
    alone would count rows nobody holds, in a session the database never ends."""
    with engine.connect() as conn:
        # One statement, so the backend's state, its locks and the rows are read together.
        rows = conn.execute(text(
            "WITH frozen AS ("
            "  SELECT a.backend_xid::text AS xid,"
            "         ARRAY(SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks l"
            "               WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted"
            "                 AND l.objsubid = 1) AS keys"
            "  FROM pg_stat_activity a"
            "  WHERE a.pid = :pid AND a.state = 'idle in transaction' AND a.backend_xid IS NOT NULL) "
            "SELECT f.keys, e.id, e.user_id, e.xmax::text = f.xid AS locked "
            "FROM frozen f JOIN scheduled_events e ON e.status = 'pending' ORDER BY e.id"), {"pid": pid}).all()
    batch = [r.id for r in rows if r.locked]
    if not batch:
        return None
    keys = set(rows[0].keys)
    participants = [r.id for r in rows if not r.locked and participant_lock_key(r.user_id) in keys]
    return batch, participants
