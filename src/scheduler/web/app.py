"""The web app: the service's route modules, mounted.

The composition root (``scheduler.service``) builds each route module with only what it uses
(ARCH-2) and hands them here; this module only mounts them: every route of the service, the
parts a host mounts on their own (``PARTS``, sorted by URL prefix: ``routes_for``,
``app_for``), the whole service as one ASGI app, and a FastAPI host's one API document
(``include_in_fastapi``). Nothing here builds an engine, a clock or a loop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.authentication import AuthenticationBackend
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp

from scheduler.observability.observer import Observer, ReplicaMiddleware
from scheduler.web.http.auth import on_auth_error
from scheduler.web.http.errors import EXCEPTION_HANDLERS

if TYPE_CHECKING:
    from fastapi import FastAPI

# What a route module hands over: its routes, built when asked for.
RouteSource = Callable[[], Sequence[BaseRoute]]
Lifespan = Callable[[ASGIApp | None], AbstractAsyncContextManager[None]]
Document = Callable[[Sequence[BaseRoute]], dict[str, Any]]

# The parts a host can mount on their own (``WebApp.app_for``), by path.
PARTS = ("api", "health", "metrics", "console", "inbox")
_PREFIXES = (("/console", "console"), ("/metrics", "metrics"), ("/health", "health"),
             ("/admin/health", "health"), ("/inbox", "inbox"), ("/me", "inbox"))


class WebApp:
    """The service's routes as ASGI apps, with its authentication, error answers and lifespan.

    ``sources`` are the route modules' routes in the order they are matched; ``console`` builds
    the console's pages only when a part that holds them is asked for (EMB-10). ``owner`` is
    what ``app.state.service`` names in every app built here; ``every_route``, when given, is
    what a part with the console selects from instead of ``routes()`` (the owner's own
    ``routes``, which a subclass of it may extend); ``document`` is the API document of some
    routes (with the service's facts contract, DEC-FACTS-CONTRACT)."""

    def __init__(self, *, sources: Sequence[RouteSource], console: Callable[[], Sequence[Route]],
                 authentication: AuthenticationBackend, lifespan: Lifespan, observer: Observer,
                 owner: object, document: Document, every_route: RouteSource | None = None,
                 replica_id: str | None = None) -> None:
        self.document = document
        self.sources = tuple(sources)
        self.every_route = every_route or self.routes
        self.console = console
        self.authentication = authentication
        self.lifespan = lifespan
        self.observer = observer
        self.owner = owner
        self.replica_id = replica_id

    def middleware(self) -> list[Middleware]:
        """What every part's app runs a request through: the replica in its log lines (OBS-8),
        then the authentication (a host's backend, or bearer JWTs)."""
        replica = [] if self.replica_id is None else [Middleware(ReplicaMiddleware, replica_id=self.replica_id)]
        return [*replica, Middleware(AuthenticationMiddleware, backend=self.authentication, on_error=on_auth_error)]

    def routes(self) -> list[BaseRoute]:
        """Every route of the service (``routes_for`` selects parts of them)."""
        return self._routes(console=True)

    def _routes(self, *, console: bool) -> list[BaseRoute]:
        every = [route for source in self.sources for route in source()]
        return every + ([_hidden(route) for route in self.console()] if console else [])

    def routes_for(self, *parts: str) -> list[BaseRoute]:
        """The routes of ``parts`` (``PARTS``; all of them when none is named), for a host that
        adds them to its own app's routes. Without the console, its pieces are never built."""
        wanted = _checked_parts(parts)
        every = self.every_route() if "console" in wanted else self._routes(console=False)
        return [route for route in every if part_of(route) in wanted]

    @functools.cached_property
    def app(self) -> Starlette:
        """The whole service as one ASGI app (every part), built when first asked for: a host
        that mounts ``app_for(...)`` parts alone never builds the others (the console)."""
        return self.app_for(*PARTS)

    def app_for(self, *parts: str) -> Starlette:
        """An ASGI app serving only ``parts`` (e.g. ``"api"``: the JSON API without the console,
        the inbox, metrics or health), with the service's authentication, error answers and
        lifespan (which runs the loop)."""
        app = Starlette(
            routes=self.routes_for(*parts),
            middleware=self.middleware(),
            exception_handlers=dict(EXCEPTION_HANDLERS),
            # Mounting the app alone runs the loop: its lifespan is the service's.
            lifespan=self.lifespan,
        )
        app.state.service = self.owner
        self.observer.instrument(app, [])
        return app

    def include_in_fastapi(self, app: FastAPI, path: str, *parts: str) -> None:
        """Mount ``app_for(*parts)`` at ``path`` of a FastAPI ``app`` and make the host's one
        ``/openapi.json`` (and ``/docs``) hold the parts' paths under ``path`` beside its own
        (EMB-11). The host's ``app.openapi`` (FastAPI's, or an override set before this call)
        builds its part of the document; a path or component both define differently is a
        ``ValueError`` when the document is first built. FastAPI is not imported here."""
        # the merge only a FastAPI host needs
        from scheduler.web.api.openapi import merged_document

        if not path.startswith("/") or path.endswith("/"):
            raise ValueError(f"the mount path must start with '/' and not end with one, got {path!r}")
        app.mount(path, self.app_for(*parts))
        host_openapi = app.openapi
        ours = functools.partial(self.document, self.routes_for(*parts))

        def openapi() -> dict[str, Any]:
            if app.openapi_schema is None:
                app.openapi_schema = merged_document(host_openapi(), ours(), path)
            return app.openapi_schema

        app.openapi_schema = None  # a document built before the mount lacks the parts
        app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override


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


__all__ = ["PARTS", "WebApp", "part_of"]
