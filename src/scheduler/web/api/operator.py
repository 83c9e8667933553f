"""The operator's routes: metrics, the replicas' heartbeats, the audit trail and the open
browser sessions.

The composition root (``scheduler.service``) builds the heartbeat and the metrics, attaches
them to the loop's ``poll_hooks``, and hands ``OperatorRoutes`` the metrics, the
sessionmaker, the clock and the web sessions' store; the console is a product of its own
(``scheduler.web.console``), mounted beside these routes by the root.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from scheduler.application import audit
from scheduler.database.database import Database
from scheduler.operations.heartbeat import list_replicas
from scheduler.operations.metrics import CONTENT_TYPE, Metrics
from scheduler.types import Clock
from scheduler.web.http.answers import OperatorActionOut, ReplicaOut, respond
from scheduler.web.http.auth import require
from scheduler.web.http.params import Param, declares, query
from scheduler.web.http.sessions import SessionStore, session_routes

MAX_ACTION_ID = 2**63 - 1  # operator_actions.id is a bigint


class OperatorRoutes:
    """``/metrics``, ``/admin/replicas``, ``/admin/audit`` and ``/admin/sessions``: what an
    operator watches and ends, over one service's database and clock."""

    def __init__(self, *, database: Database, clock: Clock, metrics: Metrics,
                 session_store: SessionStore, metrics_require_admin: bool) -> None:
        self.database = database
        self.clock = clock
        self.metrics = metrics
        # The signed-in browsers (console and inbox page): ended and listed by /admin/sessions.
        self.session_store = session_store
        self.metrics_require_admin = metrics_require_admin

    def routes(self) -> list[BaseRoute]:
        """Metrics and the operator API."""
        metrics = require("admin")(self.metrics_endpoint) if self.metrics_require_admin else self.metrics_endpoint
        return [
            Route("/metrics", metrics, methods=["GET"]),
            Route("/admin/replicas", self.replicas, methods=["GET"]),
            Route("/admin/audit", self.audit_trail, methods=["GET"]),
            *session_routes(self.session_store),
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
        rows = await run_in_threadpool(list_replicas, self.database, self.clock.now())
        return respond([ReplicaOut.model_validate(row) for row in rows])

    @require("admin")
    @declares(limit=Param.integer(1, 1000, default=100, description="at most this many actions"),
              before_id=Param.integer(1, MAX_ACTION_ID, description="the previous page's last id"))
    async def audit_trail(self, request: Request) -> Response:
        """Operator actions, newest first (``limit``, and ``before_id`` for the next page)."""
        q = query(request)
        limit, before_id = q["limit"], q["before_id"]
        rows: list[dict[str, Any]] = await run_in_threadpool(
            lambda: audit.list_actions(self.database, limit=limit, before_id=before_id))
        return respond([OperatorActionOut.model_validate(row) for row in rows])

