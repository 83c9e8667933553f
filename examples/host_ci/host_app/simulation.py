"""What the host hands the scheduler's simulation: its dispatcher and what to check of it.

``scheduler simulate --dispatcher host_app.simulation:HOST`` runs it (``REFUSING``: the same
host refusing by a returned ``DispatchResult(refusal=...)`` instead of raising; ``BROKEN``:
the broken variant); the test suite gets the same through the pytest plugin's ``scheduler_host``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from sqlalchemy import Connection, text

from harness import Expected, HostDispatcher, Outcome
from host_app.broken import OutsideTransactionDispatcher
from host_app.dispatcher import OPTED_OUT, DeliveryDispatcher, RefusingDispatcher, create_tables
from scheduler.types import DigitalTwinEvent

DELIVERIES = text("SELECT event_id, count(*) AS n FROM host_deliveries GROUP BY event_id")


def expect(event: DigitalTwinEvent) -> Expected | None:
    """An opted-out participant's event fails, and says why; every other one is dispatched."""
    if event.user_id in OPTED_OUT:
        return Expected("failed", reason="opted out")
    return None


def one_delivery_per_dispatch(connection: Connection, outcomes: Sequence[Outcome]) -> str | None:
    """Exactly one host_deliveries row per committed dispatch of an event (a row dispatched,
    re-posted and dispatched again has two), and none for anything else."""
    dispatched = Counter(o.event_id for o in outcomes if o.status == "dispatched")
    rows = {r.event_id: int(r.n) for r in connection.execute(DELIVERIES)}
    for event_id in sorted(set(dispatched) | set(rows)):
        if rows.get(event_id, 0) != dispatched[event_id]:
            return (f"{rows.get(event_id, 0)} host_deliveries rows for event {event_id}, "
                    f"which committed {dispatched[event_id]} dispatches")
    return None


HOST = HostDispatcher(factory=DeliveryDispatcher, setup=create_tables, expect=expect,
                      check_effects=one_delivery_per_dispatch, name="host_app")
REFUSING = HostDispatcher(factory=RefusingDispatcher, setup=create_tables, expect=expect,
                          check_effects=one_delivery_per_dispatch, name="host_app-refusing")
BROKEN = HostDispatcher(factory=OutsideTransactionDispatcher, setup=create_tables, expect=expect,
                        check_effects=one_delivery_per_dispatch, name="host_app-broken")
