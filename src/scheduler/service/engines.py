"""The engines a service works on: the requests' and the loop's, and which of them are its own.

Engines the service creates are its own to dispose when it stops; an engine the caller passes
stays the caller's. The scheduler's code is sync: on a host's async engine it works on its sync
psycopg twin, the service's own to dispose, and a host's engines keep the service's timeouts,
per transaction (DEC-HOST-ENGINE).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from sqlalchemy import Engine

from scheduler.config import Settings
from scheduler.database.engine import is_service_engine, make_engine, resolve_database_url
from scheduler.database.host_engine import for_scheduler, is_async, loop_engine_like, sync_twin

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

LOOP_POOL_SIZE = 2


class Engines:
    """The requests' engine (``engine``) and the loop's (``loop``), built from the settings or
    around the host's; ``owned`` are those the service disposes (``dispose``)."""

    def __init__(self, settings: Settings, engine: Engine | AsyncEngine | None,
                 loop_engine: Engine | AsyncEngine | None) -> None:
        self.settings = settings
        self.owned: list[Engine] = []
        self.engine, self.loop = self._build(engine, loop_engine)

    def _build(self, engine: Engine | AsyncEngine | None,
               loop_engine: Engine | AsyncEngine | None) -> tuple[Engine, Engine]:
        settings = self.settings
        if engine is None:
            url = resolve_database_url(settings)
            engine = make_engine(url, settings)
            self.owned.append(engine)
            if loop_engine is None:
                # The loop gets a pool of its own, so requests that take every pooled
                # connection (a slow query, a held lock) cannot starve the polls.
                loop_engine = make_engine(url, settings, pool_size=LOOP_POOL_SIZE, max_overflow=0)
                self.owned.append(loop_engine)
            return engine, self._sync(loop_engine, "loop_engine")
        host = self._sync(engine, "engine")
        own_loop = None if loop_engine is None else self._sync(loop_engine, "loop_engine")
        if own_loop is not None:
            own_loop = for_scheduler(own_loop, settings, role="loop_engine")
        elif not is_service_engine(host):
            # the loop gets a small pool of its own made like the host's engine
            own_loop = loop_engine_like(host, settings, LOOP_POOL_SIZE)
            if own_loop is not None:
                self.owned.append(own_loop)
        view = for_scheduler(host, settings)
        return view, own_loop or view

    def _sync(self, engine: Engine | AsyncEngine, role: str) -> Engine:
        """``engine`` itself, or the sync twin of an async one (owned by the service)."""
        if not is_async(engine):
            return cast(Engine, engine)
        twin = sync_twin(engine, role=role)
        self.owned.append(twin)
        return twin

    def dispose(self) -> None:
        """Dispose of the engines the service created (never the caller's own)."""
        for engine in self.owned:
            engine.dispose()
