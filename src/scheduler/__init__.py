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
    from scheduler.core.loop import EventOutcome, PollReport, Scheduler
    from scheduler.database.database import Database
    from scheduler.service import SchedulerService, create_app
    from scheduler.web.host_code import InvalidEvent, cancel, cancel_async, schedule, schedule_async
    from scheduler.web.http.auth import authenticated

_WHERE = {
    "SchedulerService": "scheduler.service",
    "create_app": "scheduler.service",
    "ManualClock": "scheduler.core.clock",
    "SystemClock": "scheduler.core.clock",
    "Settings": "scheduler.config",
    "EventOutcome": "scheduler.core.loop",
    "PollReport": "scheduler.core.loop",
    "Scheduler": "scheduler.core.loop",
    "InvalidEvent": "scheduler.web.host_code",
    "schedule": "scheduler.web.host_code",
    "schedule_async": "scheduler.web.host_code",
    "cancel": "scheduler.web.host_code",
    "cancel_async": "scheduler.web.host_code",
    "authenticated": "scheduler.web.http.auth",
    "Database": "scheduler.database.database",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "Database",
    "EventOutcome",
    "InvalidEvent",
    "ManualClock",
    "PollReport",
    "Scheduler",
    "SchedulerService",
    "Settings",
    "SystemClock",
    "authenticated",
    "cancel",
    "cancel_async",
    "create_app",
    "schedule",
    "schedule_async",
]
