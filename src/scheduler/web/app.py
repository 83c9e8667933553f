"""The Starlette application: routes, authentication, and a lifespan that runs the loop.

``SchedulerService`` holds what the routes and the loop share (database, clock, rules,
scheduler). ``create_app`` is the standalone service; another Starlette app embeds the
same thing by mounting ``service.app`` and entering ``service.lifespan`` (see README).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import DataError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp

from scheduler.application import audit
from scheduler.config import ConfigError, Settings
from scheduler.core import store
from scheduler.core.clock import SystemClock
from scheduler.core.loop import DUE_CHANNEL, Scheduler
from scheduler.database.engine import make_engine, make_sessionmaker, resolve_database_url
from scheduler.database.listener import Listener, conninfo_of
from scheduler.nudging.dispatch import NudgingPlatform
from scheduler.nudging.facts import ContractViolation, FactsMissing, check_facts_contract
from scheduler.nudging.publishers import LoggingPublisher
from scheduler.nudging.rules import Catalogue, load_catalogue
from scheduler.operations.retention import Retention
from scheduler.types import (
    Clock,
    DigitalTwinEvent,
    Dispatcher,
    DispatchOutcome,
    DispatchResult,
    EventStatus,
    NotificationStatus,
    Publisher,
    SchedulerMode,
)
from scheduler.web.admin import Operations
from scheduler.web.auth import JWTBackend, TokenVerifier, on_auth_error, require
from scheduler.web.health import health_routes
from scheduler.web.http import (
    HTTPRefusal,
    Unprocessable,
    parse_body,
    read_json,
    respond,
)
from scheduler.web.inbox import Inbox, StreamPublisher, inbox_routes
from scheduler.web.lifecycle import actor_of, lifecycle_routes
from scheduler.web.openapi import openapi_document
from scheduler.web.params import Param, declares, query, text_param
from scheduler.web.schemas import (
    DuplicateOut,
    ErrorOut,
    HealthOut,
    IngestOut,
    LiveEventIn,
    NotificationOut,
    PreferencesIn,
    PreferencesOut,
    RuleRefusalOut,
    ScheduledEventIn,
    ScheduledEventOut,
)
from scheduler.web.sse import Streams

logger = logging.getLogger(__name__)

EventBodyT = TypeVar("EventBodyT", ScheduledEventIn, LiveEventIn)
LIMIT = Param.integer(1, 1000, default=100, description="at most this many rows")

MISSING_FACTS_SCHEDULED = "Missing facts in scheduled event"
MISSING_FACTS_LIVE = "Missing facts in event"
LOOP_POOL_SIZE = 2

# The live answers of REQ-0016, the only place a dispatch outcome becomes an HTTP status.
LIVE_STATUS: dict[DispatchOutcome, int] = {
    DispatchOutcome.DELIVERED: 200,
    DispatchOutcome.SUPPRESSED: 202,
    DispatchOutcome.NO_RULE_TRIGGERED: 204,
    DispatchOutcome.DUPLICATE: 409,
    DispatchOutcome.NO_RULE_FOR_SCENARIO: 400,
    DispatchOutcome.INVALID_EVENT: 422,
}


class SchedulerService:
    """Everything one API process needs: wire it once, then serve or embed it."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        engine: Engine | None = None,
        clock: Clock | None = None,
        catalogue: Catalogue | None = None,
        dispatcher: Dispatcher | None = None,
        publisher: Publisher | None = None,
        run_scheduler: bool | None = None,
        loop_engine: Engine | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env()
        # Engines this service creates are its own to dispose when it stops; an engine the
        # caller passes stays the caller's.
        self._owned_engines: list[Engine] = []
        if engine is None:
            url = resolve_database_url(self.settings)
            engine = make_engine(url, self.settings)
            self._owned_engines.append(engine)
            if loop_engine is None:
                # The loop gets a pool of its own, so requests that take every pooled
                # connection (a slow query, a held lock) cannot starve the polls.
                loop_engine = make_engine(url, self.settings, pool_size=LOOP_POOL_SIZE, max_overflow=0)
                self._owned_engines.append(loop_engine)
        self.engine = engine
        self.loop_engine = loop_engine or engine
        self.sessions = make_sessionmaker(engine)
        self.clock = clock or SystemClock()
        self.catalogue = catalogue or load_catalogue(self.settings.rules_dir)
        self.dispatcher: Dispatcher = dispatcher or NudgingPlatform(self.catalogue)
        # After commit: number web notifications for the inbox stream and NOTIFY the
        # replicas, then the configured publisher (see scheduler.web.inbox). The live path
        # numbers on the requests' pool, the loop on its own (below).
        inner_publisher = publisher or LoggingPublisher()
        self.publisher: Publisher = StreamPublisher(self.sessions, inner_publisher)
        self.verifier = TokenVerifier(self.settings)
        self.run_scheduler = self.settings.scheduler_enabled if run_scheduler is None else run_scheduler
        loop_sessions = make_sessionmaker(self.loop_engine) if self.loop_engine is not engine else self.sessions
        self.scheduler = Scheduler(
            loop_sessions,
            self.dispatcher,
            self.clock,
            publisher=StreamPublisher(loop_sessions, inner_publisher),
            batch_size=self.settings.batch_size,
            poll_seconds=self.settings.poll_seconds,
            mode=self.settings.mode,
        )
        # One LISTEN connection for the process, started with the loop when anything
        # subscribed: prompt mode's wake-ups (below) and whatever else fans out by NOTIFY.
        self.listener = Listener(conninfo_of(engine), name="scheduler", probe_engine=engine)
        if self.settings.mode is SchedulerMode.PROMPT and self.settings.listen and self.run_scheduler:
            self.listener.subscribe(DUE_CHANNEL, self._on_due)
        # The participants' live inbox: fan-out by the process's LISTEN connection.
        self.inbox = Inbox(self.sessions, listener=self.listener if self.settings.listen else None)
        # Deletes old dispatched and cancelled rows after a poll (one replica, hourly).
        self.retention = Retention(self.loop_engine, self.clock, days=self.settings.retention_days)
        self.scheduler.poll_hooks.append(self.retention)
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        # Heartbeats, metrics, the operator API and the console (issue 9).
        # Every open stream (the inbox's, the console's): ended at once when the server stops.
        self.streams = Streams()
        self.operations = Operations(self.settings, self.sessions, self.clock, self.scheduler, self.verifier,
                                     lambda: self.loop_alive, self.streams)
        self._check_security()
        self.app = Starlette(
            routes=self.routes(),
            middleware=self.middleware(),
            exception_handlers={
                HTTPException: _http_error,
                HTTPRefusal: _refused,
                Unprocessable: _unprocessable,
                Exception: _internal_error,
                OperationalError: _database_unavailable,
                InterfaceError: _database_unavailable,
                PoolTimeout: _database_unavailable,
                DataError: _value_not_storable,
                DBAPIError: _database_error,
            },
            # Mounting service.app alone runs the loop: its lifespan is the service's.
            lifespan=self.lifespan,
        )
        self.app.state.service = self

    def _check_security(self) -> None:
        settings = self.settings
        if settings.environment == "production":
            # The secret `serve` generates into the data directory is a development
            # convenience: production must be told explicitly how to verify tokens.
            if not (settings.jwt_secret or settings.jwt_public_key or settings.jwks_url):
                raise ConfigError(
                    "production mode needs SCHEDULER_JWT_SECRET, SCHEDULER_JWT_PUBLIC_KEY or SCHEDULER_JWKS_URL "
                    f"(a generated development secret in {settings.secret_file} is not accepted)"
                )
            secret = settings.jwt_secret or ""
            if secret and _weak_secret(secret):
                raise ConfigError("production mode refuses a development-grade SCHEDULER_JWT_SECRET (use 32+ random characters)")
        else:
            logger.warning(
                "running in DEVELOPMENT mode (SCHEDULER_ENV is not 'production'): development secrets "
                "are accepted; set SCHEDULER_ENV=production and a real key before exposing this service"
            )

    # -- wiring ------------------------------------------------------------------------

    def middleware(self) -> list[Middleware]:
        return [Middleware(AuthenticationMiddleware, backend=JWTBackend(self.verifier), on_error=on_auth_error)]

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/health", self.health, methods=["GET"]),
            *health_routes(self),
            Route("/openapi.json", self.openapi, methods=["GET"], include_in_schema=False),
            Route("/admin/scheduled-events", self.create_scheduled_event, methods=["POST"]),
            Route("/admin/scheduled-events", self.list_scheduled_events, methods=["GET"]),
            Route("/admin/scheduled-events/{event_id}", self.get_scheduled_event, methods=["GET"]),
            Route("/admin/scheduled-events/{event_id}/reset", self.reset_scheduled_event, methods=["POST"]),
            Route("/admin/ingest-event", self.ingest_event, methods=["POST"]),
            Route("/admin/notifications", self.list_notifications, methods=["GET"]),
            Route("/admin/participants/{user_id}/preferences", self.set_preferences, methods=["PUT"]),
            *lifecycle_routes(self),
            *inbox_routes(self),
            *self.operations.routes(),
        ]

    @contextlib.asynccontextmanager
    async def lifespan(self, app: ASGIApp | None = None) -> AsyncIterator[None]:
        """Start the polling loop with the app; stop it (at once) when the app stops.

        Re-entrant: entered while the service already runs (started by an embedding app's
        own lifespan, or a test), it neither starts a second loop nor stops the first."""
        already_running = self._task is not None or self.listener.running
        await self.start()
        try:
            yield
        finally:
            if not already_running:
                await self.stop()

    def _on_due(self, payload: str) -> None:
        """A NOTIFY from any replica's store: a row is pending with this trigger time."""
        try:
            trigger_at: datetime | None = datetime.fromisoformat(payload) if payload else None
        except ValueError:
            trigger_at = None  # unreadable: look now, a poll costs little
        self.scheduler.announce(trigger_at)

    async def start(self) -> None:
        self.streams.reopen()
        if self.listener.has_subscribers and not self.listener.running:
            await run_in_threadpool(self.listener.start)
        if not self.run_scheduler or self._task is not None:
            return
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self.scheduler.run(self._stop), name="scheduler-loop")
        self._task.add_done_callback(_report_exit)

    async def stop(self) -> None:
        """Set the loop's stop event and wait for the loop to return (it is never cancelled);
        then stop the listener and dispose of the engines this service created."""
        self.streams.close_all()  # any stream still open ends now (``serve`` ended them earlier)
        if self._task is not None and self._stop is not None:
            self._stop.set()
            with contextlib.suppress(Exception):
                await self._task
            # A replica that stops cleanly leaves the replica list now, not stale (issue 9);
            # with the database unreachable, shutdown does not wait more than two seconds for it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run_in_threadpool(self.operations.heartbeat.forget), timeout=2.0)
            self._task = None
        await run_in_threadpool(self.listener.stop)
        for engine in self._owned_engines:
            engine.dispose()

    @property
    def loop_alive(self) -> bool:
        return self._task is not None and not self._task.done()

    # -- open routes -------------------------------------------------------------------

    @declares()
    async def health(self, request: Request) -> Response:
        return respond(HealthOut(status="ok"))

    @declares()
    async def openapi(self, request: Request) -> Response:
        """The OpenAPI document; under a mount (or ``--root-path``) its ``servers`` entry
        names the prefix, so clients call the mounted URLs."""
        return JSONResponse(openapi_document(self.app.routes, root_path=request.scope.get("root_path", "")))

    # -- ingest ------------------------------------------------------------------------

    @require("ingest")
    @declares()
    async def create_scheduled_event(self, request: Request) -> Response:
        """Store an event for later (REQ-0063, REQ-0064). Validated now, not when it fires."""
        body = await self._event_body(request, ScheduledEventIn, MISSING_FACTS_SCHEDULED)
        assert body.facts is not None
        row = await run_in_threadpool(
            store.store_event,
            self.sessions,
            event_type=body.event_type,
            user_id=body.user_id,
            community_id=body.community_id,
            external_key=body.external_key,
            trigger_at=body.trigger_at,
            facts=body.facts,
            now=self.clock.now(),
            actor=actor_of(request),
        )
        return respond(ScheduledEventOut.model_validate(row), 201)

    @require("ingest")
    @declares()
    async def ingest_event(self, request: Request) -> Response:
        """The live path: the same engine and orchestrator a scheduled event goes through."""
        body = await self._event_body(request, LiveEventIn, MISSING_FACTS_LIVE)
        assert body.facts is not None
        event = DigitalTwinEvent(body.event_type, body.user_id, body.community_id, body.facts)
        now = self.clock.now()
        result = await run_in_threadpool(self._dispatch_live, event, now)
        status = LIVE_STATUS[result.outcome]
        if result.outcome.refused:
            return respond(RuleRefusalOut.model_validate({"detail": result.detail}), status)
        if result.outcome is DispatchOutcome.NO_RULE_TRIGGERED:
            return Response(status_code=status)
        notifications = [NotificationOut.model_validate(n) for n in result.notifications]
        if result.outcome is DispatchOutcome.DUPLICATE:
            detail = "duplicate: every rule that would fire already notified for this period"
            return respond(DuplicateOut(detail=detail, outcome=result.outcome, notifications=notifications), status)
        return respond(IngestOut(outcome=result.outcome, notifications=notifications), status)

    async def _event_body(self, request: Request, model: type[EventBodyT], missing_message: str) -> EventBodyT:
        """A validated event body whose facts honour the contract (REQ-0012), or the
        documented 422: ``missing_message`` for absent facts, ``invalid_facts_contract``."""
        body = parse_body(model, await read_json(request, self.settings.max_body_bytes))
        try:
            check_facts_contract(body.facts)
        except FactsMissing:
            raise HTTPRefusal(422, missing_message) from None
        except ContractViolation as exc:
            raise HTTPRefusal(422, {"error": "invalid_facts_contract", "errors": list(exc.errors)}) from None
        return body

    def _dispatch_live(self, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        with self.sessions() as session:
            result = self.dispatcher(session, event, now)
            if result.refusal is not None:
                session.rollback()
                return result
            session.commit()
        for message in result.outbound:
            try:
                self.publisher.publish(message)
            except Exception:
                logger.exception("publishing notification %s failed", message.notification_id)
        return result

    # -- admin -------------------------------------------------------------------------

    @require("admin")
    @declares(status=Param.enum(EventStatus), user_id=Param.string(), external_key=Param.string(), limit=LIMIT)
    async def list_scheduled_events(self, request: Request) -> Response:
        q = query(request)
        rows = await run_in_threadpool(
            store.list_events,
            self.sessions,
            status=q["status"],
            user_id=q["user_id"],
            limit=q["limit"],
            external_key=q["external_key"],
        )
        return respond([ScheduledEventOut.model_validate(r) for r in rows])

    @require("admin")
    @declares()
    async def get_scheduled_event(self, request: Request) -> Response:
        event_id = _path_param(request, "event_id")
        row = await run_in_threadpool(store.get_event, self.sessions, event_id)
        if row is None:
            raise HTTPException(404, "no scheduled event with that id")
        return respond(ScheduledEventOut.model_validate(row))

    @require("admin")
    @declares()
    async def reset_scheduled_event(self, request: Request) -> Response:
        """The reset by hand: a failed (or dispatched) row goes back to pending."""
        event_id = _path_param(request, "event_id")
        row = await run_in_threadpool(
            lambda: audit.reset_one(self.sessions, event_id, self.clock.now(), actor=request.user.display_name, source="api")
        )
        if row is None:
            raise HTTPException(404, "no scheduled event with that id")
        return respond(ScheduledEventOut.model_validate(row))

    @require("admin")
    @declares(user_id=Param.string(), status=Param.enum(NotificationStatus), limit=LIMIT)
    async def list_notifications(self, request: Request) -> Response:
        q = query(request)
        rows = await run_in_threadpool(
            store.list_notifications,
            self.sessions,
            user_id=q["user_id"],
            status=q["status"],
            limit=q["limit"],
        )
        return respond([NotificationOut.model_validate(r) for r in rows])

    @require("admin")
    @declares()
    async def set_preferences(self, request: Request) -> Response:
        user_id = _path_param(request, "user_id")
        body = parse_body(PreferencesIn, await read_json(request, self.settings.max_body_bytes))
        row = await run_in_threadpool(
            store.set_preferences,
            self.sessions,
            user_id,
            enabled_kinds=body.enabled_kinds,
            max_per_day=body.max_per_day,
            now=self.clock.now(),
        )
        return respond(PreferencesOut.model_validate(row))


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPRefusal)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


async def _value_not_storable(request: Request, exc: Exception) -> Response:
    """A value the database refused (a safety net behind the schemas): the sender's 422."""
    assert isinstance(exc, DBAPIError)
    logger.warning("database refused a value: %s", exc.orig)
    first_line = str(exc.orig).splitlines()[0] if exc.orig is not None else "invalid value"
    refusal = Unprocessable.field("body", f"a value cannot be stored: {first_line}",
                                  f"a value cannot be stored: {first_line}")
    return respond(refusal.body(), 422)


async def _unprocessable(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Unprocessable)
    return respond(exc.body(), 422)


async def _internal_error(request: Request, exc: Exception) -> Response:
    """An unexpected error is still a JSON ``detail`` (Starlette logs and re-raises it)."""
    return respond(ErrorOut(detail="internal server error"), 500)


async def _database_error(request: Request, exc: Exception) -> Response:
    """A connection the pool found dead (a restart, a terminated backend) is an outage: 503."""
    assert isinstance(exc, DBAPIError)
    if exc.connection_invalidated:
        return await _database_unavailable(request, exc)
    raise exc


def _weak_secret(secret: str) -> bool:
    lowered = secret.lower()
    markers = ("dev", "test", "secret", "changeme", "example", "password")
    return len(secret) < 32 or len(set(secret)) < 12 or any(m in lowered for m in markers)


def _path_param(request: Request, name: str) -> str:
    value = str(request.path_params[name])
    text_param(name, value)
    return value


async def _database_unavailable(request: Request, exc: Exception) -> Response:
    logger.warning("database unavailable: %s", exc)
    return JSONResponse(
        {"detail": "database unavailable; retry later"}, status_code=503, headers={"Retry-After": "5"}
    )


def _report_exit(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        logger.warning("scheduler loop cancelled: reminders stop until the process restarts")
    elif task.exception() is not None:
        logger.error("scheduler loop died: reminders stop until the process restarts", exc_info=task.exception())


def create_app(settings: Settings | None = None, **kwargs: Any) -> Starlette:
    """The standalone service: ``SchedulerService(...).app``, whose lifespan runs the loop
    (the service is ``app.state.service``)."""
    return SchedulerService(settings, **kwargs).app


__all__ = ["SchedulerService", "create_app"]
