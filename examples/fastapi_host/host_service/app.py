"""The host: a FastAPI notification service with its own schema, engine, dispatcher and auth,
and the scheduler's API mounted beside its own routes under ``/nudging``.

Run it with ``uvicorn host_service.app:app`` (``DATABASE_URL`` names the one database both
use), in production too (``SCHEDULER_ENV=production``): the host's own authentication verifies
every request, so the scheduler needs no key of its own (no ``SCHEDULER_JWT_SECRET``). The scheduler's tables live in its own PostgreSQL schema, so they never meet the
host's (which has a ``notifications`` table of its own); each side migrates its own
(``alembic -c alembic.ini upgrade head`` for the host, ``scheduler migrate`` for the
scheduler).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

from fastapi import FastAPI
from sqlalchemy import create_engine, text

from host_service.auth import HostTokens
from host_service.database import database_url
from host_service.dispatcher import HostDispatcher
from scheduler import SchedulerService, Settings


def create_app() -> FastAPI:
    # The host's own engine: the scheduler's requests share it (the service applies its
    # timeouts per transaction); the loop gets a small pool of its own made like it.
    engine = create_engine(database_url(), pool_size=5, pool_pre_ping=True)
    scheduler = SchedulerService(Settings.from_env(), engine=engine, dispatcher=HostDispatcher(),
                                 authentication=HostTokens())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with scheduler.lifespan():  # the polling loop runs while the host runs
            yield
        engine.dispose()

    app = FastAPI(title="Host notification service", lifespan=lifespan)

    @app.get("/host/notifications")
    def host_notifications() -> list[dict[str, object]]:
        """The host's own table of the same name as one of the scheduler's (no clash)."""
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, user_id, body FROM notifications ORDER BY id"))
            return [dict(r) for r in rows.mappings()]

    @app.get("/host/deliveries")
    def host_deliveries() -> list[dict[str, object]]:
        """What the host's dispatcher wrote, one row per dispatched reminder."""
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT scheduled_event_id, user_id, body FROM host_deliveries ORDER BY id"))
            return [dict(r) for r in rows.mappings()]

    # Only the scheduler's JSON API and its health: no console, no inbox page, no /metrics.
    # Mounted under /nudging, and in the host's one /openapi.json (and /docs) beside its routes.
    scheduler.include_in_fastapi(app, "/nudging", "api", "health")
    return app


app = create_app() if os.environ.get("DATABASE_URL") else None
