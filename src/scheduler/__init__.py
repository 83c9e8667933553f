"""scheduler: store an event now, dispatch it later through the same rule engine.

The names below are imported on first use, so that ``import scheduler.rules`` (or any
other light module) does not pull in Starlette, Alembic and PyJWT with the web app.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scheduler.app import SchedulerService, create_app
    from scheduler.clock import ManualClock, SystemClock
    from scheduler.config import Settings
    from scheduler.loop import Batch, EventOutcome, PollReport, Scheduler

_WHERE = {
    "SchedulerService": "scheduler.app",
    "create_app": "scheduler.app",
    "ManualClock": "scheduler.clock",
    "SystemClock": "scheduler.clock",
    "Settings": "scheduler.config",
    "Batch": "scheduler.loop",
    "EventOutcome": "scheduler.loop",
    "PollReport": "scheduler.loop",
    "Scheduler": "scheduler.loop",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "Batch",
    "EventOutcome",
    "ManualClock",
    "PollReport",
    "Scheduler",
    "SchedulerService",
    "Settings",
    "SystemClock",
    "create_app",
]
