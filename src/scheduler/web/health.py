"""The loop's health, told twice: in words for anyone, in detail for admins (issue 14 §5).

``GET /health/scheduler`` is open (load balancers and uptime checks call it without a
token), so it says whether this replica's loop is healthy and why, in words an operator can
act on (``state``: running, stale, failing, stopped; ``reason``), with counters and times,
and never error text: a database error names the host, the user and the database.
``GET /admin/health/scheduler`` (admin) adds ``last_error`` and the listener's own words.
Both answer 503 when the loop is not healthy, 200 again after a good poll.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from scheduler.types import SchedulerMode
from scheduler.web.auth import require
from scheduler.web.http import respond
from scheduler.web.params import declares
from scheduler.web.schemas import SchedulerHealthDetailOut, SchedulerHealthOut

if TYPE_CHECKING:
    from scheduler.web.app import SchedulerService

State = Literal["running", "stale", "failing", "stopped"]
DETAILS = "GET /admin/health/scheduler (admin) has the error"


def details(service: SchedulerService) -> dict[str, Any]:
    """Everything the loop reports, ``last_error`` included (the admin view)."""
    scheduler = service.scheduler
    snapshot: dict[str, Any] = scheduler.health.snapshot()
    snapshot["running"] = service.loop_alive
    snapshot["stale"] = scheduler.is_stale(service.clock.now())
    snapshot["poll_seconds"] = scheduler.poll_seconds
    snapshot["mode"] = str(scheduler.mode)
    snapshot["wakeups"] = wakeups(service)
    snapshot["state"], snapshot["reason"] = judge(service, snapshot)
    snapshot["status"] = "healthy" if snapshot["state"] == "running" else "unhealthy"
    return snapshot


def judge(service: SchedulerService, snapshot: dict[str, Any]) -> tuple[State, str]:
    """The state an operator acts on, and why, in words without error text."""
    seconds = f"{snapshot['poll_seconds']:g} s"
    if not snapshot["running"]:
        if not service.run_scheduler:
            return "stopped", "this process runs no polling loop (SCHEDULER_ENABLED=false or an embedding without one)"
        if snapshot["started_at"] is None:
            return "stopped", "the polling loop has not started yet"
        return "stopped", "the polling loop has exited: reminders wait until this process restarts (see its log)"
    failures = snapshot["consecutive_failures"]
    if failures:
        return "failing", (f"the last {failures} poll(s) failed, usually the database unreachable or timing out; "
                           f"the loop retries every {seconds} and turns healthy after a good poll; {DETAILS}")
    if snapshot["stale"]:
        return "stale", (f"no poll completed in three intervals ({seconds} each): the loop or the database "
                         "is stuck or very slow")
    return "running", f"polling every {seconds} ({snapshot['mode']} mode)"


def wakeups(service: SchedulerService) -> dict[str, Any]:
    """How this replica's loop is woken: on its interval only (literal), by LISTEN, or
    by timed wake-ups where LISTEN is unavailable (with the reason)."""
    scheduler, listener = service.scheduler, service.listener
    if scheduler.mode is SchedulerMode.LITERAL:
        return {"by": "interval"}
    if not service.settings.listen:
        return {"by": "timer", "reason": "SCHEDULER_LISTEN is false"}
    if listener.available:
        return {"by": "listen", "next_wake_at": _iso(scheduler.waiting_until)}
    return {"by": "timer", "reason": listener.reason, "next_wake_at": _iso(scheduler.waiting_until)}


def public(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The open view: no error text anywhere (the listener's reason keeps its first words)."""
    shown = {k: v for k, v in snapshot.items() if k != "last_error"}
    reason = shown["wakeups"].get("reason")
    if reason:
        head, sep, _ = reason.partition(": ")  # "connection lost: OperationalError: ... host=..."
        shown["wakeups"] = {**shown["wakeups"], "reason": head + (f" ({DETAILS})" if sep else "")}
    return shown


def health_routes(service: SchedulerService) -> list[BaseRoute]:
    """``/health/scheduler`` (open) and ``/admin/health/scheduler`` (admin) for ``service``."""

    @declares()
    async def scheduler_health(request: Request) -> Response:
        """Is the loop healthy, and why (words, counters, times; no error text)."""
        snapshot = details(service)
        return respond(SchedulerHealthOut.model_validate(public(snapshot)), _status(snapshot))

    @require("admin")
    @declares()
    async def scheduler_health_details(request: Request) -> Response:
        """The same, with ``last_error`` and the listener's reason in full."""
        snapshot = details(service)
        return respond(SchedulerHealthDetailOut.model_validate(snapshot), _status(snapshot))

    return [
        Route("/health/scheduler", scheduler_health, methods=["GET"]),
        Route("/admin/health/scheduler", scheduler_health_details, methods=["GET"]),
    ]


def _status(snapshot: dict[str, Any]) -> int:
    return 200 if snapshot["state"] == "running" else 503


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None
