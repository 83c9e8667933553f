"""A participant's web-push subscriptions (PUSH-*): ``PUT /me/push-subscriptions`` stores the
browser's W3C ``PushSubscription`` (``subscription.toJSON()``), ``DELETE
/me/push-subscriptions`` removes one (the body names its endpoint) or every one of the
caller's (no body); and ``GET /inbox/service-worker.js``, the inbox page's service worker,
which shows each push as a notification.

Authenticated as the inbox's other ``/me`` routes are (``with_inbox_session``: a bearer
token, or the inbox page's session cookie) and always the caller's own subscriptions: no
``user_id``. A request by the cookie changes something, so it carries the session's CSRF token
(``X-CSRF-Token``, as signing out does); a bearer token's request needs none. The PUT body is
parsed in one place, ``delivery.subscription.read_subscription``, with the endpoint's
allow-list (``SCHEDULER_PUSH_ALLOWED_HOSTS``): an endpoint elsewhere (an internal address, an
IP, credentials in the URL) is a 422 naming ``endpoint``. It is stored by its endpoint (the
same browser subscribing again replaces its keys), and a participant keeps at most
``MAX_SUBSCRIPTIONS``: the least recently updated past that are removed. Without a VAPID key
(``SCHEDULER_VAPID_PRIVATE_KEY``) web push is off: a well-formed PUT is then a 409.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from scheduler.database.database import Database
from scheduler.delivery.hosts import AllowedHosts
from scheduler.delivery.subscription import SubscriptionRefused, read_subscription
from scheduler.types import Clock
from scheduler.web.http.answers import PushSubscriptionOut, PushUnsubscribedOut
from scheduler.web.http.answers import respond as respond_json
from scheduler.web.http.auth import CHALLENGE, PARTICIPANT, require, subject_of
from scheduler.web.http.bodies import PushUnsubscribeIn, json_of, parse_body, read_body, read_json
from scheduler.web.http.params import Unprocessable, declares
from scheduler.web.http.sessions import SessionStore, WebSession
from scheduler.web.inbox.session import CSRF_HEADER, with_inbox_session

SERVICE_WORKER = Path(__file__).parent / "pages" / "service-worker.js"
MAX_SUBSCRIPTIONS = 10  # a participant's browsers; each sent notification is pushed to each
JSON = "application/json"

# The worker's script is its own document: it loads nothing and runs nothing but itself.
SERVICE_WORKER_HEADERS = {
    "Content-Security-Policy": "default-src 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",  # the browser checks for a new worker on every registration
}


def _caller(request: Request) -> str:
    """The participant whose subscriptions these are: always the caller's own."""
    subject = subject_of(request.user)
    if subject is None:
        raise HTTPException(401, "missing bearer token", headers=CHALLENGE)
    return subject


def _check_csrf(request: Request) -> None:
    """A request made by the inbox page's cookie carries its session's CSRF token."""
    session = request.scope.get("inbox_session")
    if isinstance(session, WebSession) and not session.csrf_ok(request.headers.get(CSRF_HEADER)):
        raise HTTPException(403, "missing or wrong X-CSRF-Token: reload the page and try again")


def _check_json(request: Request) -> None:
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != JSON:
        raise HTTPException(415, "send the subscription as JSON (Content-Type: application/json)")


def push_routes(*, database: Database, clock: Clock, store: SessionStore, allowed: AllowedHosts,
                web_push_on: bool, max_body_bytes: int) -> list[BaseRoute]:
    """``PUT``/``DELETE /me/push-subscriptions`` over ``database`` (the endpoint checked against
    ``allowed``; ``web_push_on`` when a VAPID key is configured) and the service worker."""

    @require(PARTICIPANT)
    @declares()
    async def subscribe(request: Request) -> Response:
        """Store the caller's browser subscription by its endpoint (201 new, 200 replaced)."""
        user_id = _caller(request)
        _check_csrf(request)
        _check_json(request)
        try:
            parsed = read_subscription(await read_json(request, max_body_bytes), allowed)
        except SubscriptionRefused as refused:
            raise Unprocessable(refused.errors, f"invalid push subscription: {refused}") from None
        if not web_push_on:
            raise HTTPException(409, "web push is off on this service (no SCHEDULER_VAPID_PRIVATE_KEY)")
        target = parsed.target

        def upsert() -> dict[str, Any]:
            with database.begin() as session:
                return database.push_subscriptions.upsert(
                    session, user_id=user_id, endpoint=target.endpoint, p256dh=target.p256dh, auth=target.auth,
                    expiration_time=parsed.expires_at, now=clock.now(), keep=MAX_SUBSCRIPTIONS)

        row = await run_in_threadpool(upsert)
        return respond_json(PushSubscriptionOut.model_validate(row), 201 if row["created"] else 200)

    @require(PARTICIPANT)
    @declares()
    async def unsubscribe(request: Request) -> Response:
        """Remove the caller's subscription of the body's endpoint, or all of them without a body."""
        user_id = _caller(request)
        _check_csrf(request)
        raw = await read_body(request, max_body_bytes)
        endpoint: str | None = None
        if raw:
            _check_json(request)
            endpoint = parse_body(PushUnsubscribeIn, json_of(raw)).endpoint

        def delete() -> int:
            with database.begin() as session:
                return database.push_subscriptions.delete(session, user_id=user_id, endpoint=endpoint)

        return respond_json(PushUnsubscribedOut(removed=await run_in_threadpool(delete)))

    script = SERVICE_WORKER.read_bytes()

    @declares()
    async def service_worker(request: Request) -> Response:
        """The inbox page's service worker: shows each push as a notification."""
        return Response(script, media_type="text/javascript", headers=SERVICE_WORKER_HEADERS)

    return [
        Route("/me/push-subscriptions", with_inbox_session(store, subscribe), methods=["PUT"]),
        Route("/me/push-subscriptions", with_inbox_session(store, unsubscribe), methods=["DELETE"]),
        Route("/inbox/service-worker.js", service_worker, methods=["GET"]),
    ]

