"""The host: a FastAPI notification service with its own schema, async engine, facts contract,
dispatcher and auth, and the scheduler's API mounted beside its own routes under ``/nudging``.

Run it with ``uvicorn host_service.app:app`` (``DATABASE_URL`` names the one database both
use), in production too (``SCHEDULER_ENV=production``): the host's own authentication verifies
every request, so the scheduler needs no key of its own (no ``SCHEDULER_JWT_SECRET``). The
scheduler's tables live in its own PostgreSQL schema, so they never meet the host's (which
has a ``notifications`` table of its own); each side migrates its own (``alembic -c
alembic.ini upgrade head`` for the host, ``scheduler migrate`` for the scheduler).

The host's engine is an ``AsyncEngine`` (``host_service.database``), which the scheduler takes
as it is; ``POST /host/commitments`` saves a commitment and schedules its reminder in one
transaction of the host's (``host_service.commitments``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import async_sessionmaker

from host_service.auth import HostTokens
from host_service.commitments import save_commitment
from host_service.database import async_engine
from host_service.dispatcher import HostDispatcher
from host_service.facts import ReminderFacts
from scheduler import InvalidEvent, SchedulerService, Settings


class CommitmentIn(BaseModel):
    user_id: str = Field(min_length=1)
    commitment: str
    minutes: int | None = None
    remind_at: datetime


def create_app() -> FastAPI:
    # The host's own async engine: the scheduler serves its requests and its loop on the
    # engine's sync psycopg twin (the same URL and connect arguments, its pool sized alike).
    engine = async_engine(pool_size=5)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    scheduler = SchedulerService(Settings.from_env(), engine=engine, dispatcher=HostDispatcher(),
                                 authentication=HostTokens(), facts_contract=ReminderFacts)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with scheduler.lifespan():  # the polling loop runs while the host runs
            yield
        await engine.dispose()

    app = FastAPI(title="Host notification service", lifespan=lifespan)

    async def rows(query: str) -> list[dict[str, Any]]:
        async with engine.connect() as conn:
            return [dict(r) for r in (await conn.execute(text(query))).mappings()]

    @app.get("/host/notifications")
    async def host_notifications() -> list[dict[str, Any]]:
        """The host's own table of the same name as one of the scheduler's (no clash)."""
        return await rows("SELECT id, user_id, body FROM notifications ORDER BY id")

    @app.get("/host/deliveries")
    async def host_deliveries() -> list[dict[str, Any]]:
        """What the host's dispatcher wrote, one row per dispatched reminder."""
        return await rows("SELECT scheduled_event_id, user_id, body FROM host_deliveries ORDER BY id")

    @app.get("/host/commitments")
    async def host_commitments() -> list[dict[str, Any]]:
        """The host's commitments, each with the id of its reminder."""
        return await rows("SELECT id, user_id, commitment, reminder_id FROM commitments ORDER BY id")

    @app.post("/host/commitments", status_code=201, response_model=None)
    async def add_commitment(body: CommitmentIn) -> dict[str, Any] | JSONResponse:
        """A commitment and its reminder, both or neither: a reminder the scheduler refuses
        (``InvalidEvent``: the POST's 422) rolls the commitment back with it."""
        try:
            async with sessions.begin() as session:
                saved = await save_commitment(session, scheduler, user_id=body.user_id, commitment=body.commitment,
                                              minutes=body.minutes, remind_at=body.remind_at)
        except InvalidEvent as exc:
            return JSONResponse(exc.body, status_code=422)
        except IntegrityError:  # users (id): a participant the host does not know
            return JSONResponse({"detail": f"no user {body.user_id!r}",
                                 "errors": [{"field": "user_id", "message": "no such user"}]}, status_code=422)
        return {"id": saved.commitment_id, "reminder_id": saved.reminder_id}

    # Only the scheduler's JSON API and its health: no console, no inbox page, no /metrics.
    # Mounted under /nudging, and in the host's one /openapi.json (and /docs) beside its routes.
    scheduler.include_in_fastapi(app, "/nudging", "api", "health")
    return app


app = create_app() if os.environ.get("DATABASE_URL") else None
