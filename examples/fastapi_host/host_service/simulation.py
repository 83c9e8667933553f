"""The host's dispatcher in the scheduler's replica simulation, as its CI runs it.

``HOST`` is the dispatcher, the host's tables for a run (its migrations' tables, the
simulation's participants ``p0`` to ``p3`` as users, ``p3`` opted out) and what it expects of
an event (``p3``'s fail, naming the opt-out). No ``check_effects``: whether the dispatcher writes
only in the scheduler's transaction is the harness's own check (the rollback probe,
SIM-HOST-8). ``BROKEN`` is the variant that writes on a connection of its own, which the
probe must find. ``scheduler simulate --dispatcher host_service.simulation:HOST`` runs it from
the command line; ``tests/test_simulation.py`` through the wheel's pytest plugin.
"""

from __future__ import annotations

import dataclasses

from sqlalchemy import Connection, text

from harness import Expected
from harness import HostDispatcher as SimulatedHost
from host_service.broken import OwnConnectionDispatcher
from host_service.dispatcher import HostDispatcher
from scheduler.types import DigitalTwinEvent

OPTED_OUT = "p3"
# The host's tables as its migrations make them (host_0001, host_0002), for the run's database.
TABLES = (
    "CREATE TABLE IF NOT EXISTS users (id text PRIMARY KEY, opted_out boolean NOT NULL DEFAULT false)",
    "CREATE TABLE IF NOT EXISTS host_deliveries (id bigserial PRIMARY KEY, scheduled_event_id text NOT NULL,"
    " user_id text NOT NULL REFERENCES users (id), body text NOT NULL, delivered_at timestamptz NOT NULL)",
    "TRUNCATE host_deliveries, users",
)


def create_tables(connection: Connection) -> None:
    """The host's tables, emptied, with the simulation's participants as its users."""
    for statement in TABLES:
        connection.execute(text(statement))
    connection.execute(text("INSERT INTO users (id, opted_out) SELECT 'p' || i, 'p' || i = :out"
                            " FROM generate_series(0, 9) AS i"), {"out": OPTED_OUT})


def expect(event: DigitalTwinEvent) -> Expected | None:
    """An opted-out participant's reminder fails, and says why; every other is dispatched."""
    return Expected("failed", reason="opted out") if event.user_id == OPTED_OUT else None


HOST = SimulatedHost(factory=HostDispatcher, setup=create_tables, expect=expect, name="host_service")
BROKEN = dataclasses.replace(HOST, factory=OwnConnectionDispatcher, name="host_service-broken")
