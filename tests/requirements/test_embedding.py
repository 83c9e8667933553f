"""Embedding: the routes and the loop inside someone else's Starlette app.

In our words: another API process mounts ``SchedulerService.app`` under its own prefix
and enters ``SchedulerService.lifespan`` from its own lifespan; the loop then runs with
that app and stops with it, exactly as in the standalone service.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, INGEST
from tests.helpers import event_body, running


@pytest.mark.clause("OPS-7")
def test_a_host_app_mounts_the_routes_and_runs_the_loop_in_its_lifespan(
    service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """OPS-7: mounted under /nudging, the routes answer and the host's lifespan runs the loop."""
    service.run_scheduler = True
    service.scheduler.poll_seconds = 0.0

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with service.lifespan(app):
            yield

    async def home(request: Request) -> PlainTextResponse:
        return PlainTextResponse("the host's own route")

    host = Starlette(routes=[Route("/", home), Mount("/nudging", app=service.app)], lifespan=lifespan)
    with running(host) as client:
        assert client.get("/").text == "the host's own route"
        stored = client.post("/nudging/admin/scheduled-events", headers=INGEST, json=event_body())
        assert stored.status_code == 201
        assert client.post("/nudging/admin/scheduled-events", json=event_body()).status_code == 401
        for _ in range(5000):
            row = client.get(f"/nudging/admin/scheduled-events/{stored.json()['id']}", headers=ADMIN).json()
            if row["status"] != "pending":
                break
        assert row["status"] == "dispatched"
        assert client.get("/nudging/health/scheduler").json()["running"] is True
    assert service.loop_alive is False
