"""Broken hosts that only this suite's tests use, beside examples/host_ci's own (which a host
reads as an example and which fails one invariant only).

- ``CARELESS`` can fail two invariants: its delivery row commits outside the scheduler's
  transaction (SIM-12, as ``host_app.simulation:BROKEN``) and it delivers to a participant
  who opted out, whom the host expects to fail (SIM-4, by its ``expect`` hook). A shrinker
  that kept any failure instead of the reported one would hand back the wrong one.
- ``BROKEN_WITHOUT_SETUP`` is ``BROKEN`` without a setup hook of its own: its table exists
  only when the run is given ``--setup host_app.dispatcher:create_tables`` (or the plugin's
  ``scheduler_sim_setup``), so a replay that forgot the setup cannot pass for one that kept it.
- ``UNCHECKED``, ``UNCHECKED_BROKEN`` and ``UNCHECKED_UPDATING`` have no ``check_effects``:
  only the harness's rollback probe (SIM-HOST-8) can find what the broken ones commit on a
  connection of their own (a delivery row; an update of a counter in a schema of the host's).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from scheduler.types import DigitalTwinEvent, DispatchOutcome, DispatchResult
from tests.simulation.host_example import import_example

import_example()
from host_app.broken import OutsideTransactionDispatcher  # noqa: E402
from host_app.dispatcher import INSERT, DeliveryDispatcher, create_tables  # noqa: E402
from host_app.simulation import BROKEN, HOST  # noqa: E402

SETUP_PATH = "host_app.dispatcher:create_tables"


class CarelessDispatcher(OutsideTransactionDispatcher):
    """Both bugs: the row on a connection of its own, and no opt-out check before it."""

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        row = {"event_id": event.scheduled_event_id, "user_id": event.user_id, "body": "Reminder", "now": now}
        if self.engine is None:
            self.engine = create_engine(session.get_bind().engine.url, poolclass=NullPool)
        with self.engine.begin() as own:
            own.execute(INSERT, row)
        return DispatchResult(outcome=DispatchOutcome.DELIVERED)


CARELESS = dataclasses.replace(HOST, factory=CarelessDispatcher, name="careless")
BROKEN_WITHOUT_SETUP = dataclasses.replace(BROKEN, setup=None, name="broken-without-setup")


class CounterDispatcher(OutsideTransactionDispatcher):
    """The example's delivery in the session, and a counter of the host's (a table in a schema
    of its own) bumped on a connection of its own: an update, no row more or fewer."""

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        if self.engine is None:
            self.engine = create_engine(session.get_bind().engine.url, poolclass=NullPool)
        with self.engine.begin() as own:
            own.execute(text("UPDATE host_counters.sent SET n = n + 1"))
        return DeliveryDispatcher()(session, event, now)


def create_counter_tables(connection: Connection) -> None:
    """The example's table, and a one-row counter in the schema ``host_counters``."""
    create_tables(connection)
    connection.execute(text("CREATE SCHEMA IF NOT EXISTS host_counters"))
    connection.execute(text("CREATE TABLE IF NOT EXISTS host_counters.sent (n bigint NOT NULL)"))
    connection.execute(text("TRUNCATE host_counters.sent"))
    connection.execute(text("INSERT INTO host_counters.sent VALUES (0)"))


# The example's hosts without their effects check: the harness's rollback probe alone (SIM-HOST-8).
UNCHECKED = dataclasses.replace(HOST, check_effects=None, name="unchecked")
UNCHECKED_BROKEN = dataclasses.replace(BROKEN, check_effects=None, name="unchecked-broken")
UNCHECKED_UPDATING = dataclasses.replace(HOST, factory=CounterDispatcher, setup=create_counter_tables,
                                         check_effects=None, name="unchecked-updating")
