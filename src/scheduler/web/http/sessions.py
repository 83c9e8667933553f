"""Browser sessions in the database: sign in once, then an opaque cookie.

A browser signs in with a token; the service verifies it once and stores a session in
``web_sessions``: the subject, the kind (``admin`` for the console, ``participant`` for
the inbox), when it was made, when it ends (``expires_at``: the token's expiry or
``SCHEDULER_SESSION_MAX_SECONDS``, whichever is sooner) and how long it may sit unused
(``SCHEDULER_SESSION_IDLE_SECONDS`` after ``last_seen_at``). The browser's cookie holds a
random 256-bit session id, the session's *secret*; the table holds only its SHA-256, so a
copy of the table (or a backup, or a log of its rows) opens nothing, and the cookie is
not a token the API accepts.

Every request resolves its cookie with one statement that checks both expiries and marks
the session seen, so any replica serves any session and a deleted session (sign-out, or
an admin ending it) is refused by every replica from the next request on. The session's
CSRF token is an HMAC of its secret: it changes with each session and dies with it.
Times come from the service's injected clock.

``session_routes`` is the admin's API over the table: ``GET /admin/sessions`` and
``DELETE /admin/sessions/{id}`` (``id`` is a public handle, never the secret).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from scheduler.database.database import Database
from scheduler.types import Clock
from scheduler.web.http.answers import WebSessionOut, respond
from scheduler.web.http.auth import require
from scheduler.web.http.params import Param, declares, path_param, query

SessionKind = Literal["admin", "participant"]
SESSION_KINDS: tuple[SessionKind, ...] = ("admin", "participant")


class KindParam(StrEnum):
    """``?kind=`` of ``GET /admin/sessions``: the session kinds."""

    ADMIN = "admin"
    PARTICIPANT = "participant"
_CSRF_MESSAGE = b"scheduler-session-csrf-v1"


def secret_hash(secret: str) -> str:
    """What the table keeps of a session id: its SHA-256 (the id is 256 random bits, so a
    fast hash suffices; nobody can guess a preimage)."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class WebSession:
    """A session as a request sees it: ``secret`` is the cookie's value (never stored)."""

    id: str
    subject: str
    kind: str
    created_at: datetime
    expires_at: datetime
    last_seen_at: datetime
    idle_seconds: int
    secret: str

    @property
    def csrf(self) -> str:
        """The session's CSRF token: other pages cannot read the cookie, so cannot compute it."""
        return hmac.new(self.secret.encode(), _CSRF_MESSAGE, hashlib.sha256).hexdigest()

    def csrf_ok(self, submitted: str | None) -> bool:
        return bool(submitted) and hmac.compare_digest(self.csrf, str(submitted))


def _out(row: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    values = dict(row)
    idle_until = values["last_seen_at"] + timedelta(seconds=values["idle_seconds"])
    values["ends_at"] = min(values["expires_at"], idle_until)
    return values


class SessionStore:
    """The ``web_sessions`` table, with the service's clock and lifetime settings."""

    def __init__(self, database: Database, clock: Clock, *, max_seconds: int, idle_seconds: int) -> None:
        self.database = database
        self.clock = clock
        self.max_seconds = max_seconds
        self.idle_seconds = idle_seconds

    def create(self, subject: str, kind: SessionKind, *, token_seconds_left: float,
               user_agent: str | None = None) -> WebSession:
        """A new session for a verified token: it ends with the token, or sooner by the settings.

        ``token_seconds_left`` is the token's remaining life (its ``exp`` less the time the
        token was verified at); the session's end is that long after the injected clock's now,
        capped at ``max_seconds``. Sessions that have ended are purged here.
        """
        now = self.clock.now()
        lifetime = max(0.0, min(float(self.max_seconds), token_seconds_left))
        secret = secrets.token_urlsafe(32)
        public_id = secrets.token_hex(12)
        expires_at = now + timedelta(seconds=int(lifetime))
        with self.database.begin() as session:
            self.database.web_sessions.create(
                session, public_id=public_id, secret_hash=secret_hash(secret), subject=subject, kind=kind,
                now=now, expires_at=expires_at, idle_seconds=self.idle_seconds,
                user_agent=(user_agent or "")[:200] or None)
        return WebSession(public_id, subject, kind, now, expires_at, now, self.idle_seconds, secret)

    def resolve(self, secret: str | None, kind: SessionKind) -> WebSession | None:
        """The open session of a cookie (marked seen now), or None: unknown, ended, or another kind."""
        if not secret or len(secret) > 200:
            return None
        with self.database.begin() as session:
            row = self.database.web_sessions.touch(session, secret_hash=secret_hash(secret), kind=kind,
                                                   now=self.clock.now())
        if row is None:
            return None
        return WebSession(row["id"], row["subject"], row["kind"], row["created_at"], row["expires_at"],
                          row["last_seen_at"], row["idle_seconds"], secret)

    def is_open(self, secret: str, kind: SessionKind) -> bool:
        """Whether the session of a cookie is still open, without counting this as use: a
        long stream checks it as it runs, so a signed-out session's stream ends and an idle
        one is not kept alive by the stream alone."""
        with self.database.begin() as session:
            return self.database.web_sessions.is_open(session, secret_hash=secret_hash(secret), kind=kind,
                                                      now=self.clock.now())

    def sign_out(self, secret: str) -> bool:
        """Delete the session of a cookie; True if there was one."""
        with self.database.begin() as session:
            return self.database.web_sessions.delete_by_hash(session, secret_hash(secret))

    def end(self, session_id: str, *, actor: str, source: str) -> dict[str, Any] | None:
        """An admin ends a session by its public id, recorded in the audit trail in the same
        transaction; its row as it was, or None if unknown."""
        now = self.clock.now()
        with self.database.begin() as session:
            # the audit trail's row is written in the same transaction
            row = self.database.web_sessions.end(session, session_id, now=now, actor=actor, source=source)
        return None if row is None else _out(row, now)

    def list_open(self, *, kind: SessionKind | None = None, limit: int = 200) -> list[dict[str, Any]]:
        """The sessions that have not ended, most recently seen first."""
        now = self.clock.now()
        with self.database.begin() as session:
            rows = self.database.web_sessions.list_open(session, now=now, kind=kind, limit=limit)
        return [_out(r, now) for r in rows]


def session_routes(store: SessionStore) -> list[BaseRoute]:
    """``GET /admin/sessions`` and ``DELETE /admin/sessions/{id}`` (permission: admin)."""

    @require("admin")
    @declares(kind=Param.enum(KindParam, "only the console's (admin) or the inbox page's (participant) sessions"))
    async def list_sessions(request: Request) -> Response:
        """The open sessions of the console and the inbox, most recently seen first."""
        raw = query(request)["kind"]
        kind: SessionKind | None = "admin" if raw == "admin" else "participant" if raw == "participant" else None
        rows = await run_in_threadpool(lambda: store.list_open(kind=kind))
        return respond([WebSessionOut.model_validate(r) for r in rows])

    @require("admin")
    @declares()
    async def end_session(request: Request) -> Response:
        """End a session now (audited): its cookie is refused by every replica from the next request."""
        session_id = path_param(request, "session_id")
        actor = request.user.display_name
        row = await run_in_threadpool(lambda: store.end(session_id, actor=actor, source="api"))
        if row is None:
            raise HTTPException(404, "no session with that id")
        return respond(WebSessionOut.model_validate(row))

    return [
        Route("/admin/sessions", list_sessions, methods=["GET"]),
        Route("/admin/sessions/{session_id}", end_session, methods=["DELETE"]),
    ]


__all__ = ["SESSION_KINDS", "SessionStore", "WebSession", "secret_hash", "session_routes"]
