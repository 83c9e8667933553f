"""Broken hosts that only this suite's tests use, beside examples/host_ci's own (which a host
reads as an example and which fails one invariant only).

- ``CARELESS`` can fail two invariants: its delivery row commits outside the scheduler's
  transaction (SIM-12, as ``host_app.simulation:BROKEN``) and it delivers to a participant
  who opted out, whom the host expects to fail (SIM-4, by its ``expect`` hook). A shrinker
  that kept any failure instead of the reported one would hand back the wrong one.
- ``BROKEN_WITHOUT_SETUP`` is ``BROKEN`` without a setup hook of its own: its table exists
  only when the run is given ``--setup host_app.dispatcher:create_tables`` (or the plugin's
  ``scheduler_sim_setup``), so a replay that forgot the setup cannot pass for one that kept it.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from scheduler.types import DigitalTwinEvent, DispatchOutcome, DispatchResult
from tests.simulation.host_example import import_example

import_example()
from host_app.broken import OutsideTransactionDispatcher  # noqa: E402
from host_app.dispatcher import INSERT  # noqa: E402
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
