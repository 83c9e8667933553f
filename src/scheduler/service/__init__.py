"""The composition root: ``SchedulerService`` builds the service's parts and wires them.

It creates the engines (``engines``) and the service's ``Database`` on them (its schema, its
statements and repositories: DEC-DB), the clock, the catalogue and dispatch path, the loop and
its LISTEN connection, the inbox hub, the hooks after each poll (retention, the heartbeat, the
metrics, the delivery worker's wake-up), the web sessions' store and the route modules, each
handed only what it uses (ARCH-2); the web app (``scheduler.web.app.WebApp``) mounts those. Its
lifespan runs the tasks (``tasks``); what it refuses before anything runs is ``policy``.
``create_app`` is the standalone service; another Starlette app embeds the same thing by
mounting ``service.app`` and entering ``service.lifespan`` (see README).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.authentication import AuthenticationBackend
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from scheduler.config import ConfigError, Settings
from scheduler.core.clock import DatabaseClock
from scheduler.core.loop import DUE_CHANNEL, Scheduler
from scheduler.database.database import Database
from scheduler.database.engine import tcp_parameters
from scheduler.database.listener import Listener, conninfo_of
from scheduler.delivery.channels import (
    PER_SUBSCRIPTION,
    allowed_push_hosts,
    built_in_channels,
    built_in_senders,
    retry_policy,
    vapid_key,
)
from scheduler.delivery.http import DeliveryHttp, HttpClient
from scheduler.nudging.decision import NudgingPlatform
from scheduler.nudging.facts import FactsContract
from scheduler.nudging.orchestrator import LoggingPublisher, Orchestrator, OutboxChannel, WebChannel
from scheduler.nudging.rules import Catalogue, load_catalogue
from scheduler.observability.observer import Observer, replica_context
from scheduler.observability.tracing import observe, observer_from_env
from scheduler.operations.delivery_worker import DeliveryWorker
from scheduler.operations.heartbeat import Heartbeat
from scheduler.operations.host_outbox import with_outbox
from scheduler.operations.metrics import Metrics
from scheduler.operations.outbox_health import OutboxHealth
from scheduler.operations.retention import Retention
from scheduler.service.engines import Engines
from scheduler.service.policy import check_security, checked_senders, dispatcher_schema_problem
from scheduler.service.tasks import Tasks
from scheduler.types import (
    Clock,
    Dispatcher,
    Publisher,
    SchedulerMode,
    Sender,
    refuse_async_dispatcher,
)
from scheduler.web.api.bulk_store import BulkStoreRoutes
from scheduler.web.api.health import HealthRoutes
from scheduler.web.api.intake import LIVE, IngestRoutes
from scheduler.web.api.operator import OperatorRoutes
from scheduler.web.api.participants import ParticipantRoutes
from scheduler.web.api.scheduled_events import EventRoutes
from scheduler.web.app import RouteSource, WebApp
from scheduler.web.http.auth import JWTBackend, TokenVerifier
from scheduler.web.http.sessions import SessionStore
from scheduler.web.http.sse import Streams
from scheduler.web.inbox.hub import Inbox, StreamPublisher
from scheduler.web.inbox.push import push_routes
from scheduler.web.inbox.routes import inbox_routes

if TYPE_CHECKING:
    from fastapi import FastAPI
    from sqlalchemy.ext.asyncio import AsyncEngine

    from scheduler.web.console.pages import Console


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
        self.host_senders = checked_senders(senders)
        self.settings = settings or Settings.from_env()
        # The host's own facts contract replaces the built-in one wherever an event is stored
        # (the POST, the batch, ``scheduler.schedule``; DEC-FACTS-CONTRACT).
        self.facts_contract = facts_contract
        self._engines = Engines(self.settings, engine, loop_engine)
        self.engine, self.loop_engine = self._engines.engine, self._engines.loop
        # The service's database: every statement names its own schema (DEC-SCHEMA, DEC-DB),
        # whatever other service shares the process; the loop's pool is the same database.
        self.database = Database(self.engine, self.settings.database_schema)
        self.loop_database = self.database.on(self.loop_engine)
        self.sessions = self.database.sessions
        # One clock in production: the database server's, measured (DEC-10). An injected
        # clock (tests, the simulation) is used as it is.
        self.clock: Clock = clock or DatabaseClock(self.loop_database.server_time,
                                                   warn_seconds=self.settings.clock_skew_warn_seconds)
        self.catalogue = catalogue or load_catalogue(self.settings.rules_dir)
        # web push (PUSH-*): the public half of the VAPID key is the inbox page's applicationServerKey
        key = vapid_key(self.settings)
        self.vapid_public_key: str | None = key.public_key_b64url if key is not None else None
        # The outbox's channels (DEC-OUTBOX): the built-in ones the settings turn on, and the
        # host's own senders by name; the decision queues a row for each beside the in-app one.
        self.outbox_channels = tuple(dict.fromkeys([*built_in_channels(self.settings), *self.host_senders]))
        # A host's dispatcher queues its ``DispatchResult.outbox`` on these channels (OUTBOX-7).
        self.dispatcher: Dispatcher = (
            with_outbox(dispatcher, self.database, self.outbox_channels)
            if dispatcher is not None and not isinstance(dispatcher, NudgingPlatform)
            else dispatcher or NudgingPlatform(
                self.catalogue,
                Orchestrator([WebChannel(), *(OutboxChannel(name, per_subscription=name in PER_SUBSCRIPTION)
                                              for name in self.outbox_channels)]),
                decisions=self.database.decisions))
        problem = dispatcher_schema_problem(self.dispatcher, self.database.schema)
        if problem is not None:
            self._engines.dispose()
            raise ConfigError(problem)
        self.delivery: DeliveryWorker | None = None
        self._http: HttpClient | None = None
        # After commit: number web notifications for the inbox stream and NOTIFY the
        # replicas, then the configured publisher (see scheduler.web.inbox.hub). The live
        # path numbers on the requests' pool, the loop on its own.
        inner_publisher = publisher or LoggingPublisher()
        # Tokens are judged by production's one clock too (DEC-10); an injected clock is the
        # scheduler's own time (tests step it by days), so tokens keep the wall clock then.
        self.verifier = TokenVerifier(self.settings, clock=self.clock if clock is None else None)
        self.run_scheduler = self.settings.scheduler_enabled if run_scheduler is None else run_scheduler
        self.scheduler = Scheduler(self.loop_database, self.dispatcher, self.clock,
                                   publisher=StreamPublisher(self.loop_database, inner_publisher),
                                   batch_size=self.settings.batch_size, poll_seconds=self.settings.poll_seconds,
                                   mode=self.settings.mode)
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
        # The service's tasks, its loop's polls and its requests log as this replica (OBS-8).
        self._tasks = Tasks(self.heartbeat.replica_id)
        # Observability: spans for requests, statements, polls and dispatches when
        # OTEL_TRACES_EXPORTER asks (or ``observer`` traces); log context either way.
        self.observer = observer if observer is not None else observer_from_env()
        self._route_modules(listener, inner_publisher)
        self.web = WebApp(sources=self._route_sources(), console=lambda: self.console.routes,
                          authentication=self.authentication, lifespan=self.lifespan, observer=self.observer,
                          owner=self, document=self._document, every_route=lambda: self.routes(),
                          replica_id=self.heartbeat.replica_id)
        check_security(self.settings, host_authentication=authentication is not None)
        # the loop's observer and the SQLAlchemy instrumentation (each app ``app_for`` builds
        # is instrumented as it is built)
        observe(self.observer, app=None, engines=[self.engine, self.loop_engine], loop=self.scheduler,
                replica_id=self.heartbeat.replica_id)

    # -- the pieces, in the order ``__init__`` builds them ------------------------------

    def _listener(self) -> Listener:
        """One LISTEN connection for the process, started with the loop when anything
        subscribed: prompt mode's wake-ups and whatever else fans out by NOTIFY (the inbox)."""
        listener = Listener(conninfo_of(self.engine), name="scheduler", probe_engine=self.engine,
                            connect_args=tcp_parameters(self.settings))
        if self.settings.mode is SchedulerMode.PROMPT and self.settings.listen and self.run_scheduler:
            listener.subscribe(DUE_CHANNEL, self.scheduler.announce_notified)
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

    def delivery_worker(self, *, client: HttpClient | None = None) -> DeliveryWorker:
        """This replica's delivery worker, with the built-in senders on a fresh HTTP client (or
        ``client``, which the service then closes when it stops) and the host's (built on start;
        ``run_once`` steps it in a test)."""
        if self.delivery is None:
            # a kept-alive connection per send slot
            self._http = client or DeliveryHttp(self.settings.delivery_concurrency)
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
        self.batch = BulkStoreRoutes(database=self.database, clock=self.clock, default_expiry=settings.default_expiry,
                                 facts_contract=self.facts_contract,
                                 max_events=settings.bulk_max_events,
                                 max_body_bytes=settings.bulk_max_body_bytes,
                                 max_item_bytes=settings.max_body_bytes, observer=self.observer)
        self.events = EventRoutes(database=self.database, clock=self.clock)
        self.participants = ParticipantRoutes(database=self.database, clock=self.clock,
                                              max_body_bytes=settings.max_body_bytes)
        self.operator = OperatorRoutes(database=self.database, clock=self.clock, metrics=self.metrics,
                                       session_store=self.web_sessions,
                                       metrics_require_admin=settings.metrics_require_admin)

    def _route_sources(self) -> list[RouteSource]:
        """The route modules' routes in the order they are matched (the console's come last)."""
        def inbox() -> list[BaseRoute]:
            return inbox_routes(database=self.database, inbox=self.inbox, store=self.web_sessions,
                                verifier=self.verifier, max_body_bytes=self.settings.max_body_bytes,
                                streams=self.streams, vapid_public_key=self.vapid_public_key)

        def push() -> list[BaseRoute]:
            return push_routes(database=self.database, clock=self.clock, store=self.web_sessions,
                               allowed=allowed_push_hosts(self.settings), web_push_on=self.vapid_public_key is not None,
                               max_body_bytes=self.settings.max_body_bytes)

        return [self.health.routes, self.ingest.routes, self.batch.routes, self.events.routes,
                self.participants.routes, inbox, push, self.operator.routes]

    def _document(self, routes: Sequence[BaseRoute]) -> dict[str, Any]:
        """The API document of ``routes``, its bodies' facts by the service's contract; the
        OpenAPI module is imported when a document is first built."""
        from scheduler.web.api.openapi import openapi_document

        return openapi_document(routes, facts_contract=self.facts_contract)

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

    # -- the web app (``scheduler.web.app``) over the route modules ----------------------

    @property
    def app(self) -> Starlette:
        """The whole service as one ASGI app (every part), built when first asked for."""
        return self.web.app

    def app_for(self, *parts: str) -> Starlette:
        """An ASGI app serving only ``parts`` (``scheduler.web.app.PARTS``), with the service's
        authentication, error answers and lifespan; ``service.app`` is every part."""
        return self.web.app_for(*parts)

    def routes(self) -> list[BaseRoute]:
        """Every route of the service (``routes_for`` selects parts of them)."""
        return self.web.routes()

    def routes_for(self, *parts: str) -> list[BaseRoute]:
        return self.web.routes_for(*parts)

    def middleware(self) -> list[Middleware]:
        return self.web.middleware()

    def include_in_fastapi(self, app: FastAPI, path: str, *parts: str) -> None:
        """Mount ``app_for(*parts)`` at ``path`` of a FastAPI ``app``, with one API document (EMB-11)."""
        self.web.include_in_fastapi(app, path, *parts)

    def wakeups(self) -> dict[str, Any]:
        """How this replica's loop is woken (see ``HealthRoutes.wakeups``)."""
        return self.health.wakeups()

    # -- running ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: ASGIApp | None = None) -> AsyncIterator[None]:
        """Start the polling loop with the app; stop it (at once) when the app stops.

        Re-entrant: entered while the service already runs (started by an embedding app's
        own lifespan, or a test), it neither starts a second loop nor stops the first."""
        tasks = self._tasks
        already_running = tasks.loop is not None or self.listener.running or tasks.clock is not None
        await self.start()
        try:
            yield
        finally:
            if not already_running:
                await self.stop()

    async def start(self) -> None:
        tasks = self._tasks
        self.streams.reopen()
        if isinstance(self.clock, DatabaseClock):
            await tasks.start_clock(self.clock)
        if self.listener.has_subscribers and not self.listener.running:
            await run_in_threadpool(replica_context(self.heartbeat.replica_id).run, self.listener.start)
        if not self.run_scheduler or tasks.loop is not None:
            return
        if self.outbox_channels and tasks.delivery is None:
            tasks.start_delivery(self.delivery_worker())
        tasks.start_loop(self.scheduler)

    async def stop(self) -> None:
        """Set the loop's stop event and wait for the loop to return (it is never cancelled);
        then stop the delivery worker (closing its HTTP client) and the listener, and dispose
        of the engines this service created."""
        self.streams.close_all()  # any stream still open ends now (``serve`` ended them earlier)
        await self._tasks.stop_clock()
        if await self._tasks.stop_loop():
            # A replica that stops cleanly leaves the replica list now, not stale;
            # with the database unreachable, shutdown does not wait more than two seconds for it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run_in_threadpool(self.heartbeat.forget), timeout=2.0)
        await self._tasks.stop_delivery()
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        self.delivery = None
        await run_in_threadpool(self.listener.stop)
        self._engines.dispose()

    @property
    def loop_alive(self) -> bool:
        return self._tasks.loop_alive


def create_app(settings: Settings | None = None, **kwargs: Any) -> Starlette:
    """The standalone service: ``SchedulerService(...).app``, whose lifespan runs the loop
    (the service is ``app.state.service``)."""
    return SchedulerService(settings, **kwargs).app


__all__ = ["SchedulerService", "create_app"]
