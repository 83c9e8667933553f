"""scheduler: store an event now, dispatch it later through the same rule engine."""

from scheduler.app import SchedulerService, create_app
from scheduler.clock import ManualClock, SystemClock
from scheduler.config import Settings
from scheduler.loop import Batch, EventOutcome, PollReport, Scheduler

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
