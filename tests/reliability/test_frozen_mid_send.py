"""REL-15: a replica frozen part-way through sending a round trip still holds nothing for long.

The batch's statements that go together travel as one message (DEC-1, ``database.pipeline``)
because PostgreSQL arms ``idle_in_transaction_session_timeout`` only when it has answered a
whole round trip and runs each message the moment it has it whole: a round trip of several
messages, cut in the middle by a freeze, left the backend running what it had and waiting
for the rest, with the batch's locks and no timeout (what the partition scenario caught one
run in three). Here the cut is deterministic: a proxy between the replica and PostgreSQL
(a fake at the network's edge) forwards the first 8 KB of the batch's last round trip, the
outcomes with the COMMIT, and nothing after, as a frozen replica or a dead network path
would. The server must still end the session within the timeout and release the rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from scheduler.config import Settings
from scheduler.core.poll import claim_rounds
from scheduler.core.strategies import commit_outcomes
from scheduler.database.database import Database
from scheduler.database.engine import make_engine
from scheduler.database.events import EventRepository
from scheduler.types import EventOutcome
from tests.conftest import T0
from tests.proxy import UnixSocketProxy, running, through, unix_socket_of
from tests.reliability.support import store_due, wait_until

TIMEOUT_MS = 500
FORWARDED = 8192  # libpq's chunk: what a sender frozen mid-write had handed over


class CuttingProxy(UnixSocketProxy):
    """A proxy (a fake at the edge) that, once ``cut`` is called, forwards only the next
    ``FORWARDED`` bytes the client sends and holds back the rest."""

    def __init__(self, unix_path: str) -> None:
        self.budget: int | None = None  # bytes still to forward after the cut; None: no cut
        self.held = 0
        super().__init__(unix_path)

    def cut(self) -> None:
        with self.lock:
            self.budget = FORWARDED

    def upstream(self, data: bytes) -> bytes:
        with self.lock:
            if self.budget is None:
                return data
            data, rest = data[:self.budget], data[self.budget:]
            self.budget -= len(data)
            self.held += len(rest)
            return data


@pytest.fixture
def proxy(database_url: str) -> Iterator[CuttingProxy]:
    with running(CuttingProxy(unix_socket_of(database_url))) as cutting:
        yield cutting


def _alive(engine: Engine, pid: int) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"),
                                 {"pid": pid}).scalar_one())


def _locked(engine: Engine, ids: list[str]) -> int:
    """How many of ``ids`` another transaction holds (they would be skipped by a claim)."""
    with engine.begin() as conn:
        free = conn.execute(text("SELECT count(*) FROM (SELECT id FROM scheduled_events WHERE id = ANY(:ids) "
                                 "FOR UPDATE SKIP LOCKED) AS f"), {"ids": ids}).scalar_one()
    return len(ids) - int(free)


@pytest.mark.clause("REL-15")
def test_a_replica_frozen_mid_send_of_its_commit_round_trip_is_ended_by_the_database(
    database_url: str, engine: Engine, proxy: CuttingProxy
) -> None:
    """REL-15: the batch's last round trip (its outcomes with the COMMIT, 40 KB) reaches the server
    only in part; the server ends the session within the idle timeout and the rows are free."""
    ids = store_due(engine, [f"user-{i}" for i in range(3)], T0)
    frozen_engine = make_engine(through(database_url, proxy),
                                Settings(idle_in_transaction_timeout_ms=TIMEOUT_MS), pool_size=1, max_overflow=0)
    session = Database(frozen_engine)()
    errors: list[BaseException] = []
    try:
        events, _, _ = claim_rounds(session, T0, 20, Database(frozen_engine).events)
        assert [e.id for e in events] == ids and _locked(engine, ids) == 3
        pid = session.connection().connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
        outcomes = [EventOutcome.dispatched(e, T0) for e in events]
        # an outcome's error text makes the round trip 40 KB: several libpq chunks
        outcomes[0] = dataclasses.replace(outcomes[0], error="x" * 40_000)
        proxy.cut()

        def finish() -> None:
            try:
                commit_outcomes(session, outcomes, EventRepository.of())
            except BaseException as exc:  # noqa: BLE001 - reported to the test below
                errors.append(exc)
            finally:
                with contextlib.suppress(Exception):
                    session.close()

        sender = threading.Thread(target=finish, daemon=True)
        sender.start()
        wait_until(lambda: proxy.held > 0, "the proxy to hold back the rest of the round trip", timeout=10)
        wait_until(lambda: not _alive(engine, pid), "the server to end the session frozen mid-send", timeout=10)
        assert _locked(engine, ids) == 0  # the rows are free for every other replica
        with engine.connect() as conn:
            pending = text("SELECT count(*) FROM scheduled_events WHERE status = 'pending'")
            assert conn.execute(pending).scalar_one() == 3
    finally:
        proxy.close()  # the frozen client's connection goes: its send ends with an error
        frozen_engine.dispose()
    sender.join(timeout=10)
    assert not sender.is_alive()
    assert errors and isinstance(errors[0], DBAPIError)  # its batch failed whole; nothing committed
