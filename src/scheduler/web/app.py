"""The composition root: ``SchedulerService`` builds the service's parts and wires them.

It creates the engines and the service's ``Database`` on them (its schema, its statements and
repositories: DEC-DB), the clock, the catalogue and dispatch path, the loop and its LISTEN
connection, the inbox hub, retention, the heartbeat and the metrics, the web sessions' store,
then hands each product's route modules (the JSON API, the inbox, the console, built when
first asked for) only what they use: the database, the clock, the dispatch path, the token
verifier, the sessions' store, the loop. No route module knows this class, so nothing
imports back into it. ``create_app`` is the standalone service; another Starlette
app embeds the same thing by mounting ``service.app`` and entering ``service.lifespan``
(see README).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

import anyio.to_thread
import httpx
from anyio import CapacityLimiter
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.applications import Starlette
from starlette.authentication import AuthenticationBackend
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp

from scheduler.config import ConfigError, Settings
from scheduler.core.clock import DatabaseClock
from scheduler.core.loop import DUE_CHANNEL, Scheduler
from scheduler.database.database import Database
from scheduler.database.engine import (
    is_service_engine,
    make_engine,
    resolve_database_url,
    tcp_parameters,
)
from scheduler.database.host_engine import for_scheduler, is_async, loop_engine_like, sync_twin
from scheduler.database.listener import Listener, conninfo_of
from scheduler.delivery.channels import built_in_channels, built_in_senders, retry_policy
from scheduler.nudging.dispatch import NudgingPlatform
from scheduler.nudging.facts import FactsContract
from scheduler.nudging.orchestrator import Orchestrator, OutboxChannel, WebChannel
from scheduler.nudging.publishers import LoggingPublisher
from scheduler.nudging.rules import Catalogue, load_catalogue
from scheduler.observability.observer import Observer
from scheduler.observability.tracing import observe, observer_from_env
from scheduler.operations.delivery_worker import DeliveryWorker
from scheduler.operations.heartbeat import Heartbeat
from scheduler.operations.host_outbox import with_outbox
from scheduler.operations.metrics import Metrics
from scheduler.operations.outbox_health import OutboxHealth
from scheduler.operations.retention import Retention
from scheduler.types import (
    Clock,
    Dispatcher,
    Publisher,
    SchedulerMode,
    Sender,
    refuse_async_dispatcher,
)
from scheduler.web.api.batch import BatchRoutes
from scheduler.web.api.health import HealthRoutes
from scheduler.web.api.ingest import LIVE, IngestRoutes
from scheduler.web.api.operator import OperatorRoutes
from scheduler.web.api.participants import ParticipantRoutes
from scheduler.web.api.scheduled_events import EventRoutes
from scheduler.web.http.auth import JWTBackend, TokenVerifier, on_auth_error
from scheduler.web.http.errors import EXCEPTION_HANDLERS
from scheduler.web.http.sessions import SessionStore
from scheduler.web.http.sse import Streams
from scheduler.web.inbox.hub import Inbox, StreamPublisher
from scheduler.web.inbox.routes import inbox_routes

if TYPE_CHECKING:
    from fastapi import FastAPI
    from sqlalchemy.ext.asyncio import AsyncEngine

    from scheduler.web.console.pages import Console

logger = logging.getLogger(__name__)

LOOP_POOL_SIZE = 2
# How often production's clock measures the database's time again (DEC-10), and how soon
# it tries again while it has never succeeded (the database unreachable at start).
CLOCK_SYNC_SECONDS = 5.0
CLOCK_RETRY_SECONDS = 1.0


class SchedulerService:
    """Everything one API process needs: wire it once, then serve or embed it."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        engine: Engine | AsyncEngine | None = None,
        clock: Clock | None = None,
        catalogue: Catalogue | None = None,
        dispatcher: Dispatcher | None = None,
        publisher: Publisher | None = None,
        run_scheduler: bool | None = None,
        loop_engine: Engine | AsyncEngine | None = None,
        observer: Observer | None = None,
        authentication: AuthenticationBackend | None = None,
        metrics_registry: CollectorRegistry | None = None,
        facts_contract: FactsContract | None = None,
        senders: Mapping[str, Sender] | None = None,
    ) -> None:
        if dispatcher is not None:
            refuse_async_dispatcher(dispatcher)  # before any engine is made: nothing to dispose
        host_senders = _checked_senders(senders)
        self.settings = settings or Settings.from_env()
        # The host's own facts contract replaces the built-in one wherever an event is stored
        # (the POST, the batch, ``scheduler.schedule``; DEC-FACTS-CONTRACT).
        self.facts_contract = facts_contract
        self.engine, self.loop_engine = self._engines(engine, loop_engine)
        # The service's database: every statement names its own schema (DEC-SCHEMA, DEC-DB),
        # whatever other service shares the process; the loop's pool is the same database.
        self.database = Database(self.engine, self.settings.database_schema)
        self.loop_database = self.database.on(self.loop_engine)
        self.sessions = self.database.sessions
        # One clock in production: the database server's, measured (DEC-10). An injected
        # clock (tests, the simulation) is used as it is.
        self.clock: Clock = clock or DatabaseClock(self.loop_database.server_time,
                                                   warn_seconds=self.settings.clock_skew_warn_seconds)
        self._clock_task: asyncio.Task[None] | None = None
        self.catalogue = catalogue or load_catalogue(self.settings.rules_dir)
        # The outbox's channels (DEC-OUTBOX): the built-in ones the settings turn on, and the
        # host's own senders by name; the decision queues a row for each beside the in-app one.
        self.host_senders = host_senders
        self.outbox_channels = tuple(dict.fromkeys([*built_in_channels(self.settings), *host_senders]))
        # A host's dispatcher queues its ``DispatchResult.outbox`` on these channels (OUTBOX-7).
        self.dispatcher: Dispatcher = (
            with_outbox(dispatcher, self.database, self.outbox_channels)
            if dispatcher is not None and not isinstance(dispatcher, NudgingPlatform)
            else dispatcher or NudgingPlatform(
                self.catalogue, Orchestrator([WebChannel(), *(OutboxChannel(n) for n in self.outbox_channels)]),
                decisions=self.database.decisions))
        self._check_dispatcher_schema(self.dispatcher)
        self.delivery: DeliveryWorker | None = None
        self._delivery_task: asyncio.Task[None] | None = None
        self._delivery_stop: asyncio.Event | None = None
        self._http: httpx.AsyncClient | None = None
        # After commit: number web notifications for the inbox stream and NOTIFY the
        # replicas, then the configured publisher (see scheduler.web.inbox.hub). The live
        # path numbers on the requests' pool, the loop on its own.
        inner_publisher = publisher or LoggingPublisher()
        # Tokens are judged by production's one clock too (DEC-10); an injected clock is the
        # scheduler's own time (tests step it by days), so tokens keep the wall clock then.
        self.verifier = TokenVerifier(self.settings, clock=self.clock if clock is None else None)
        self.run_scheduler = self.settings.scheduler_enabled if run_scheduler is None else run_scheduler
        self.scheduler = self._loop(inner_publisher)
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        listener = self._listener()
        # The participants' live inbox: fan-out by the process's LISTEN connection.
        self.inbox = Inbox(self.database, listener=listener if self.settings.listen else None)
        # Every open stream (the inbox's, the console's): ended at once when the server stops.
        self.streams = Streams()
        # Signed-in browsers (the console's, the inbox page's), in the database: any replica serves them.
        self.web_sessions = SessionStore(self.database, self.clock, max_seconds=self.settings.session_max_seconds,
                                         idle_seconds=self.settings.session_idle_seconds)
        # The host's own authentication when it passes one (DEC-AUTH-1), else bearer JWTs.
        self.authentication: AuthenticationBackend = authentication or JWTBackend(self.verifier)
        self._attach_poll_hooks(metrics_registry)
        # Observability: spans for requests, statements, polls and dispatches when
        # OTEL_TRACES_EXPORTER asks (or ``observer`` traces); log context either way.
        self.observer = observer if observer is not None else observer_from_env()
        self._route_modules(listener, inner_publisher)
        self._check_security(host_authentication=authentication is not None)
        # observability: the loop's observer and the SQLAlchemy instrumentation (each app
        # ``app_for`` builds is instrumented as it is built)
        observe(self.observer, app=None, engines=[self.engine, self.loop_engine], loop=self.scheduler,
                replica_id=self.heartbeat.replica_id)

    # -- the pieces, in the order ``__init__`` builds them ------------------------------

    def _engines(self, engine: Engine | AsyncEngine | None,
                 loop_engine: Engine | AsyncEngine | None) -> tuple[Engine, Engine]:
        """The requests' engine and the loop's. Engines this service creates are its own to
        dispose when it stops; an engine the caller passes stays the caller's."""
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
            return engine, self._sync(loop_engine, "loop_engine")
        # the scheduler's code is sync: on a host's async engine it works on its sync
        # psycopg twin, the service's own to dispose (DEC-HOST-ENGINE)
        host = self._sync(engine, "engine")
        own_loop = None if loop_engine is None else self._sync(loop_engine, "loop_engine")
        # A host's engines keep the service's timeouts, per transaction (DEC-HOST-ENGINE).
        if own_loop is not None:
            own_loop = for_scheduler(own_loop, self.settings, role="loop_engine")
        elif not is_service_engine(host):
            # the loop gets a small pool of its own made like the host's engine
            own_loop = loop_engine_like(host, self.settings, LOOP_POOL_SIZE)
            if own_loop is not None:
                self._owned_engines.append(own_loop)
        view = for_scheduler(host, self.settings)
        return view, own_loop or view

    def _sync(self, engine: Engine | AsyncEngine, role: str) -> Engine:
        """``engine`` itself, or the sync twin of an async one (owned by the service)."""
        if not is_async(engine):
            return cast(Engine, engine)
        twin = sync_twin(engine, role=role)
        self._owned_engines.append(twin)
        return twin

    def _loop(self, inner_publisher: Publisher) -> Scheduler:
        """The polling loop, on the loop's own pool, numbering web notifications there."""
        return Scheduler(
            self.loop_database,
            self.dispatcher,
            self.clock,
            publisher=StreamPublisher(self.loop_database, inner_publisher),
            batch_size=self.settings.batch_size,
            poll_seconds=self.settings.poll_seconds,
            mode=self.settings.mode,
        )

    def _listener(self) -> Listener:
        """One LISTEN connection for the process, started with the loop when anything
        subscribed: prompt mode's wake-ups and whatever else fans out by NOTIFY (the inbox)."""
        listener = Listener(conninfo_of(self.engine), name="scheduler", probe_engine=self.engine,
                            connect_args=tcp_parameters(self.settings))
        if self.settings.mode is SchedulerMode.PROMPT and self.settings.listen and self.run_scheduler:
            listener.subscribe(DUE_CHANNEL, self._on_due)
        return listener

    def _attach_poll_hooks(self, metrics_registry: CollectorRegistry | None) -> None:
        """What runs after each poll: retention (deletes old dispatched and cancelled rows and
        the heartbeats of gone replicas, one replica, hourly), this replica's heartbeat and the metrics."""
        self.retention = Retention(self.loop_database, self.clock, days=self.settings.retention_days,
                                   replicas=self.settings.replica_retention,
                                   notification_days=self.settings.notification_retention_days)
        # On the loop's own pool: requests that hold every API connection never delay it.
        self.heartbeat = Heartbeat(self.loop_database, self.clock)
        # the event types known in advance start at zero on /metrics
        self.metrics = Metrics(self.database, self.clock, lambda: self.loop_alive, registry=metrics_registry,
                               event_types=self.catalogue.scenarios())
        self.scheduler.poll_hooks.extend([self.retention, self.heartbeat, self.metrics, self._wake_delivery])

    def _wake_delivery(self, _: Scheduler) -> None:
        """After a poll: the batch may have queued deliveries; the worker looks now."""
        if self.delivery is not None:
            self.delivery.wake()

    def delivery_worker(self) -> DeliveryWorker:
        """This replica's delivery worker, with the built-in senders on a fresh HTTP client and
        the host's (built on start; ``run_once`` steps it in a test)."""
        if self.delivery is None:
            self._http = httpx.AsyncClient()
            senders = {**built_in_senders(self.settings, client=self._http, clock=self.clock), **self.host_senders}
            self.delivery = DeliveryWorker(self.loop_database, senders, self.clock,
                                           policy=retry_policy(self.settings),
                                           concurrency=self.settings.delivery_concurrency,
                                           timeout=self.settings.delivery_timeout_seconds,
                                           worker_id=self.heartbeat.replica_id)
            self.delivery.observers.append(self.metrics.deliveries)
        return self.delivery

    def _route_modules(self, listener: Listener, inner_publisher: Publisher) -> None:
        """The route modules, each with what it uses and nothing else (ARCH-2)."""
        settings = self.settings
        self.health = HealthRoutes(scheduler=self.scheduler, clock=self.clock, listener=listener,
                                   settings=settings, loop_alive=lambda: self.loop_alive,
                                   mounted=lambda: self.app.routes, run_scheduler=lambda: self.run_scheduler,
                                   facts_contract=self.facts_contract,
                                   outbox=OutboxHealth(self.database, self.clock,
                                                       stale_seconds=settings.delivery_stale_seconds))
        self.ingest = IngestRoutes(database=self.database, clock=self.clock, dispatcher=self.dispatcher,
                                   publisher=StreamPublisher(self.database, inner_publisher, name=LIVE),
                                   max_body_bytes=settings.max_body_bytes, observer=self.observer,
                                   default_expiry=settings.default_expiry, facts_contract=self.facts_contract)
        self.batch = BatchRoutes(database=self.database, clock=self.clock, default_expiry=settings.default_expiry,
                                 facts_contract=self.facts_contract,
                                 max_events=settings.batch_max_events,
                                 max_body_bytes=settings.batch_max_body_bytes,
                                 max_item_bytes=settings.max_body_bytes, observer=self.observer)
        self.events = EventRoutes(database=self.database, clock=self.clock)
        self.participants = ParticipantRoutes(database=self.database, clock=self.clock,
                                              max_body_bytes=settings.max_body_bytes)
        self.operator = OperatorRoutes(database=self.database, clock=self.clock, metrics=self.metrics,
                                       session_store=self.web_sessions,
                                       metrics_require_admin=settings.metrics_require_admin)

    @functools.cached_property
    def console(self) -> Console:
        """The operator console, built (and its templates loaded) when first asked for: a host
        that does not mount it never imports its pieces (EMB-10)."""
        from scheduler.web.console.pages import Console

        return Console(self.database, self.clock, self.verifier, self.web_sessions,
                       refresh_seconds=self.settings.console_refresh_seconds, streams=self.streams,
                       max_body_bytes=self.settings.max_body_bytes)

    # The live path's publisher and the process's LISTEN connection can be replaced after
    # wiring (a test's witness, a listener with another probe): the root re-wires its parts.
    @property
    def publisher(self) -> Publisher:
        return self.ingest.publisher

    @publisher.setter
    def publisher(self, publisher: Publisher) -> None:
        self.ingest.publisher = publisher

    @property
    def listener(self) -> Listener:
        return self.health.listener

    @listener.setter
    def listener(self, listener: Listener) -> None:
        self.health.listener = listener

    def _check_dispatcher_schema(self, dispatcher: Dispatcher) -> None:
        """A ``NudgingPlatform`` the host built for another schema would write its decisions
        there: refused in a sentence before anything runs (DEC-DB)."""
        decisions = getattr(dispatcher, "decisions", None) if isinstance(dispatcher, NudgingPlatform) else None
        if decisions is not None and decisions.schema != self.database.schema:
            self._dispose_owned()
            raise ConfigError(
                f"the dispatcher passed to SchedulerService decides in schema {decisions.schema!r}, the service's "
                f"is {self.database.schema!r} (SCHEDULER_DATABASE_SCHEMA): build it with "
                f"NudgingPlatform(catalogue, decisions=Database(engine, {self.database.schema!r}).decisions)")

    def _dispose_owned(self) -> None:
        for engine in self._owned_engines:
            engine.dispose()

    def _check_security(self, host_authentication: bool) -> None:
        settings = self.settings
        if settings.environment == "production":
            # The secret `serve` generates into the data directory is a development
            # convenience: production must be told explicitly how to verify tokens, or be
            # given the host's own authentication, which then decides every request (PERM-11).
            if not (host_authentication or settings.jwt_secret or settings.jwt_public_key or settings.jwks_url):
                raise ConfigError(
                    "production mode needs SCHEDULER_JWT_SECRET, SCHEDULER_JWT_PUBLIC_KEY or SCHEDULER_JWKS_URL, "
                    "or the host's own authentication (SchedulerService(authentication=...)) "
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
        """What every part's app runs a request through: the authentication (a host's backend,
        or bearer JWTs)."""
        return [Middleware(AuthenticationMiddleware, backend=self.authentication, on_error=on_auth_error)]

    def routes(self) -> list[BaseRoute]:
        """Every route of the service (``routes_for`` selects parts of them)."""
        return self._routes(console=True)

    def _routes(self, *, console: bool) -> list[BaseRoute]:
        return [
            *self.health.routes(),
            *self.ingest.routes(),
            *self.batch.routes(),
            *self.events.routes(),
            *self.participants.routes(),
            *inbox_routes(database=self.database, inbox=self.inbox, store=self.web_sessions, verifier=self.verifier,
                          max_body_bytes=self.settings.max_body_bytes, streams=self.streams),
            *self.operator.routes(),
            *([_hidden(route) for route in self.console.routes] if console else []),
        ]

    def routes_for(self, *parts: str) -> list[BaseRoute]:
        """The routes of ``parts`` (``PARTS``; all of them when none is named), for a host that
        adds them to its own app's routes. Without the console, its pieces are never built."""
        wanted = _checked_parts(parts)
        every = self.routes() if "console" in wanted else self._routes(console=False)
        return [route for route in every if part_of(route) in wanted]

    @functools.cached_property
    def app(self) -> Starlette:
        """The whole service as one ASGI app (every part), built when first asked for: a host
        that mounts ``app_for(...)`` parts alone never builds the others (the console)."""
        return self.app_for(*PARTS)

    def app_for(self, *parts: str) -> Starlette:
        """An ASGI app serving only ``parts`` (e.g. ``"api"``: the JSON API without the console,
        the inbox, metrics or health), with the service's authentication, error answers and
        lifespan (which runs the loop); ``service.app`` is every part."""
        app = Starlette(
            routes=self.routes_for(*parts),
            middleware=self.middleware(),
            exception_handlers=dict(EXCEPTION_HANDLERS),
            # Mounting the app alone runs the loop: its lifespan is the service's.
            lifespan=self.lifespan,
        )
        app.state.service = self
        self.observer.instrument(app, [])
        return app

    def include_in_fastapi(self, app: FastAPI, path: str, *parts: str) -> None:
        """Mount ``app_for(*parts)`` at ``path`` of a FastAPI ``app`` and make the host's one
        ``/openapi.json`` (and ``/docs``) hold the parts' paths under ``path`` beside its own
        (EMB-11). The host's ``app.openapi`` (FastAPI's, or an override set before this call)
        builds its part of the document; a path or component both define differently is a
        ``ValueError`` when the document is first built. FastAPI is not imported here."""
        # the merge only a FastAPI host needs
        from scheduler.web.api.openapi import merged_document, openapi_document

        if not path.startswith("/") or path.endswith("/"):
            raise ValueError(f"the mount path must start with '/' and not end with one, got {path!r}")
        app.mount(path, self.app_for(*parts))
        host_openapi = app.openapi
        ours = functools.partial(openapi_document, self.routes_for(*parts), facts_contract=self.facts_contract)

        def openapi() -> dict[str, Any]:
            if app.openapi_schema is None:
                app.openapi_schema = merged_document(host_openapi(), ours(), path)
            return app.openapi_schema

        app.openapi_schema = None  # a document built before the mount lacks the parts
        app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override

    def wakeups(self) -> dict[str, Any]:
        """How this replica's loop is woken (see ``HealthRoutes.wakeups``)."""
        return self.health.wakeups()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: ASGIApp | None = None) -> AsyncIterator[None]:
        """Start the polling loop with the app; stop it (at once) when the app stops.

        Re-entrant: entered while the service already runs (started by an embedding app's
        own lifespan, or a test), it neither starts a second loop nor stops the first."""
        already_running = self._task is not None or self.listener.running or self._clock_task is not None
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
        if isinstance(self.clock, DatabaseClock) and self._clock_task is None:
            # The first reading before the loop's first claim; then every few seconds.
            await self._sync_clock(self.clock, CapacityLimiter(1))
            self._clock_task = asyncio.create_task(self._keep_clock_synced(self.clock), name="scheduler-clock")
        if self.listener.has_subscribers and not self.listener.running:
            await run_in_threadpool(self.listener.start)
        if not self.run_scheduler or self._task is not None:
            return
        if self.outbox_channels and self._delivery_task is None:
            self._delivery_stop = asyncio.Event()
            self._delivery_task = asyncio.create_task(self.delivery_worker().run(self._delivery_stop),
                                                      name="scheduler-delivery")
            self._delivery_task.add_done_callback(_report_delivery_exit)
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self.scheduler.run(self._stop), name="scheduler-loop")
        self._task.add_done_callback(_report_exit)

    async def _sync_clock(self, clock: DatabaseClock, limiter: CapacityLimiter) -> bool:
        try:
            await anyio.to_thread.run_sync(clock.sync, limiter=limiter)
        except (DBAPIError, PoolTimeout) as exc:
            # Unreachable database: the loop's polls fail too and say why; keep trying.
            logger.debug("reading the database's clock failed: %s", type(exc).__name__)
            return False
        return True

    async def _keep_clock_synced(self, clock: DatabaseClock) -> None:
        """Measure the database's time every CLOCK_SYNC_SECONDS, on a thread limiter of its
        own (requests filling the threadpool cannot hold it up); cancelled by ``stop``."""
        limiter = CapacityLimiter(1)
        while True:
            await asyncio.sleep(CLOCK_SYNC_SECONDS if clock.synced else CLOCK_RETRY_SECONDS)
            await self._sync_clock(clock, limiter)

    async def stop(self) -> None:
        """Set the loop's stop event and wait for the loop to return (it is never cancelled);
        then stop the listener and dispose of the engines this service created."""
        self.streams.close_all()  # any stream still open ends now (``serve`` ended them earlier)
        if self._clock_task is not None:
            self._clock_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._clock_task
            self._clock_task = None
        if self._task is not None and self._stop is not None:
            self._stop.set()
            with contextlib.suppress(Exception):
                await self._task
            # A replica that stops cleanly leaves the replica list now, not stale;
            # with the database unreachable, shutdown does not wait more than two seconds for it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run_in_threadpool(self.heartbeat.forget), timeout=2.0)
            self._task = None
        await self._stop_delivery()
        await run_in_threadpool(self.listener.stop)
        self._dispose_owned()

    async def _stop_delivery(self) -> None:
        """Stop the delivery worker: sends in flight are cancelled (their leases run out and
        another claim sends them again, with the same keys); close its HTTP client."""
        if self._delivery_task is not None and self._delivery_stop is not None:
            self._delivery_stop.set()
            with contextlib.suppress(Exception):
                await self._delivery_task
            self._delivery_task = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        self.delivery = None

    @property
    def loop_alive(self) -> bool:
        return self._task is not None and not self._task.done()


# The parts a host can mount on their own (``SchedulerService.app_for``), by path.
PARTS = ("api", "health", "metrics", "console", "inbox")
_PREFIXES = (("/console", "console"), ("/metrics", "metrics"), ("/health", "health"),
             ("/admin/health", "health"), ("/inbox", "inbox"), ("/me", "inbox"))


def part_of(route: BaseRoute) -> str:
    """The part a route belongs to: the console's pages, metrics, health, the participant's
    inbox (its page, its session and ``/me``), else the JSON API (``/admin``, ``/openapi.json``)."""
    path = str(getattr(route, "path", ""))
    for prefix, part in _PREFIXES:
        if path == prefix or path.startswith(prefix + "/"):
            return part
    return "api"


def _checked_parts(parts: tuple[str, ...]) -> frozenset[str]:
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"unknown part(s) {unknown}: the parts are {', '.join(PARTS)}")
    return frozenset(parts or PARTS)


def _hidden(route: Route) -> Route:
    """Console pages are HTML for people, not API operations: left out of /openapi.json."""
    route.include_in_schema = False
    return route


def _weak_secret(secret: str) -> bool:
    lowered = secret.lower()
    markers = ("dev", "test", "secret", "changeme", "example", "password")
    return len(secret) < 32 or len(set(secret)) < 12 or any(m in lowered for m in markers)


def _checked_senders(senders: Mapping[str, Sender] | None) -> dict[str, Sender]:
    """A host's senders by channel name: each a ``Sender`` (an ``async def send``), named by a
    channel the in-app one is not."""
    checked: dict[str, Sender] = {}
    for name, sender in (senders or {}).items():
        if not isinstance(name, str) or not name or len(name) > 32 or name == WebChannel.name:
            raise ValueError(f"a sender's channel is a name of 1 to 32 characters other than 'web', got {name!r}")
        if not isinstance(sender, Sender) or not inspect.iscoroutinefunction(sender.send):
            raise TypeError(f"the sender for {name!r} is not a Sender: it needs an async def send(delivery)")
        checked[name] = sender
    return checked


def _report_delivery_exit(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("delivery worker died: deliveries wait until the process restarts", exc_info=task.exception())


def _report_exit(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        logger.warning("scheduler loop cancelled: reminders stop until the process restarts")
    elif task.exception() is not None:
        logger.error("scheduler loop died: reminders stop until the process restarts", exc_info=task.exception())


def create_app(settings: Settings | None = None, **kwargs: Any) -> Starlette:
    """The standalone service: ``SchedulerService(...).app``, whose lifespan runs the loop
    (the service is ``app.state.service``)."""
    return SchedulerService(settings, **kwargs).app


__all__ = ["PARTS", "SchedulerService", "create_app", "part_of"]
