"""Operations: heartbeats, metrics, the operator API and the console.

The composition root (``scheduler.web.app``) creates one ``Operations`` with the
settings, the sessionmaker, the clock, the loop, the token verifier and the web sessions'
store, and mounts
``operations.routes()``; ``Operations`` attaches the heartbeat and the metrics to the
loop's ``poll_hooks``, so an embedding app gets all of it by mounting ``service.app``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from scheduler.application import audit
from scheduler.config import Settings
from scheduler.core.loop import Scheduler
from scheduler.operations.heartbeat import Heartbeat, list_replicas
from scheduler.operations.metrics import CONTENT_TYPE, Metrics
from scheduler.types import Clock
from scheduler.web.auth import TokenVerifier, require
from scheduler.web.http import respond
from scheduler.web.params import Param, declares, query
from scheduler.web.schemas import OperatorActionOut, ReplicaOut
from scheduler.web.sessions import SessionStore, session_routes
from scheduler.web.sse import Streams

if TYPE_CHECKING:
    from scheduler.web.console import Console

MAX_ACTION_ID = 2**63 - 1  # operator_actions.id is a bigint


class Operations:
    """What an operator watches and does: wired to one service's database, clock and loop."""

    def __init__(self, settings: Settings, sessions: sessionmaker[Session], clock: Clock,
                 scheduler: Scheduler, verifier: TokenVerifier, session_store: SessionStore,
                 loop_alive: Callable[[], bool], streams: Streams | None = None,
                 registry: CollectorRegistry | None = None, event_types: Iterable[str] = ()) -> None:
        self.settings = settings
        self.sessions = sessions
        self.clock = clock
        # On the loop's own pool: requests that hold every API connection never delay it.
        self.heartbeat = Heartbeat(scheduler.sessions, clock)
        # the event types known in advance start at zero on /metrics
        self.metrics = Metrics(sessions, clock, loop_alive, registry=registry, event_types=event_types)
        # The signed-in browsers (console and inbox page): ended and listed by /admin/sessions.
        self.session_store = session_store
        self._verifier, self._streams = verifier, streams
        self._console: Console | None = None
        scheduler.poll_hooks.extend([self.heartbeat, self.metrics])

    @property
    def console(self) -> Console:
        """The operator console, built (and its templates loaded) when first asked for: a host
        that does not mount it never imports its pieces (Jinja among them)."""
        if self._console is None:
            from scheduler.web.console import Console

            self._console = Console(self.sessions, self.clock, self._verifier, self.session_store,
                                    refresh_seconds=self.settings.console_refresh_seconds, streams=self._streams,
                                    max_body_bytes=self.settings.max_body_bytes)
        return self._console

    def routes(self, console: bool = True) -> list[BaseRoute]:
        """Metrics, the operator API and (unless ``console`` is false) the console's pages."""
        metrics = require("admin")(self.metrics_endpoint) if self.settings.metrics_require_admin else self.metrics_endpoint
        return [
            Route("/metrics", metrics, methods=["GET"]),
            Route("/admin/replicas", self.replicas, methods=["GET"]),
            Route("/admin/audit", self.audit_trail, methods=["GET"]),
            *session_routes(self.session_store),
            *([_hidden(r) for r in self.console.routes] if console else []),
        ]

    @declares()
    async def metrics_endpoint(self, request: Request) -> Response:
        """Prometheus text format; gauges that need a query are computed here (cached)."""
        body = await run_in_threadpool(self.metrics.exposition)
        return Response(body, media_type=CONTENT_TYPE)

    @require("admin")
    @declares()
    async def replicas(self, request: Request) -> Response:
        """Every replica's heartbeat, with ``stale`` (silent three poll intervals) and ``state``."""
        rows = await run_in_threadpool(list_replicas, self.sessions, self.clock.now())
        return respond([ReplicaOut.model_validate(row) for row in rows])

    @require("admin")
    @declares(limit=Param.integer(1, 1000, default=100, description="at most this many actions"),
              before_id=Param.integer(1, MAX_ACTION_ID, description="the previous page's last id"))
    async def audit_trail(self, request: Request) -> Response:
        """Operator actions, newest first (``limit``, and ``before_id`` for the next page)."""
        q = query(request)
        limit, before_id = q["limit"], q["before_id"]
        rows: list[dict[str, Any]] = await run_in_threadpool(
            lambda: audit.list_actions(self.sessions, limit=limit, before_id=before_id))
        return respond([OperatorActionOut.model_validate(row) for row in rows])


def _hidden(route: Route) -> Route:
    """Console pages are HTML for people, not API operations: left out of /openapi.json."""
    route.include_in_schema = False
    return route
