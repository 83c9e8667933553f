"""A gate at the dispatcher edge, for shutdown tests: an evaluator that holds an event in
flight until the test opens the gate (a file), so SIGTERM lands mid-batch by construction.

Referenced from a rule as ``reliability.gate:wait_at_gate``; the gate directory comes from
``RELIABILITY_GATE_DIR``. The wait is bounded (``RELIABILITY_GATE_TIMEOUT``, 120 s) so a
broken test can never leave a replica stuck for ever.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from scheduler.types import DigitalTwinEvent


def gate_dir() -> Path:
    return Path(os.environ["RELIABILITY_GATE_DIR"])


def wait_at_gate(event: DigitalTwinEvent) -> bool:
    """Mark this event as in flight, then wait until ``<gate>/open`` exists; then fire."""
    gate = gate_dir()
    (gate / f"in-flight-{event.scheduled_event_id or event.user_id}").touch()
    deadline = time.monotonic() + float(os.environ.get("RELIABILITY_GATE_TIMEOUT", "120"))
    while not (gate / "open").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the gate was never opened")
        threading.Event().wait(0.02)
    return True


GATED_RULE = {
    "id": "gated-reminder",
    "scenarios": ["gated"],
    "frequency": "daily",
    "kind": "reminder",
    "required_facts": [],
    "title": "Gated {{ scope }}",
    "body": "Held at the gate, then sent.",
    "evaluator": "reliability.gate:wait_at_gate",
}
