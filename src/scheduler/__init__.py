"""scheduler: store an event now, dispatch it later through the same rule engine.

The names below are imported on first use, so that ``import scheduler.nudging.rules`` (or any
other light module) does not pull in Starlette, Alembic and PyJWT with the web app.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scheduler.config import Settings
    from scheduler.core.clock import ManualClock, SystemClock
    from scheduler.core.loop import Batch, EventOutcome, PollReport, Scheduler
    from scheduler.database.database import Database
    from scheduler.web.app import SchedulerService, create_app

_WHERE = {
    "SchedulerService": "scheduler.web.app",
    "create_app": "scheduler.web.app",
    "ManualClock": "scheduler.core.clock",
    "SystemClock": "scheduler.core.clock",
    "Settings": "scheduler.config",
    "Batch": "scheduler.core.loop",
    "EventOutcome": "scheduler.core.loop",
    "PollReport": "scheduler.core.loop",
    "Scheduler": "scheduler.core.loop",
    "Database": "scheduler.database.database",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "Batch",
    "Database",
    "EventOutcome",
    "ManualClock",
    "PollReport",
    "Scheduler",
    "SchedulerService",
    "Settings",
    "SystemClock",
    "create_app",
]
