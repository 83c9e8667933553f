"""PUSH-9 in real Chromium: the inbox page subscribes this device and its service worker shows
what the local push service decrypted.

Chromium's own push service is Google's (FCM), out of reach here: the page's
``PushManager.subscribe`` is answered by a subscription of ``scheduler.testing``'s local push
service instead (an init script, the one fake: the browser's push backend). Everything else
is the browser's: the page's button, its service worker registration, its PUT with the
session's CSRF token, and the worker's ``push`` handler, fed (over the DevTools protocol's
``ServiceWorker.deliverPushMessage``) with the payload the local push service decrypted from
the worker's real, encrypted push.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from scheduler.core.clock import ManualClock
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.service import SchedulerService
from scheduler.testing.push_service import LocalPushService
from tests.conftest import INGEST, token
from tests.helpers import bounded, drain, event_body, rows
from tests.operations.browser import CHROMIUM_ARGS, chromium_or_skip
from tests.requirements.test_web_push import PUSH_ORIGIN, VAPID, push_settings
from tests.servers import serve, wait_for

pytestmark = pytest.mark.browser

# The browser's push backend, answered with the local push service's subscription: ``subscribe``
# checks it is given the page's applicationServerKey, as a browser would use it.
FAKE_PUSH_BACKEND = """
(() => {
  const made = %s;
  let current = null;
  const subscription = {
    endpoint: made.endpoint, expirationTime: null,
    toJSON() { return made; },
    unsubscribe() { current = null; return Promise.resolve(true); },
  };
  PushManager.prototype.subscribe = function (options) {
    const key = btoa(String.fromCharCode(...new Uint8Array(options.applicationServerKey)))
      .replace(/\\+/g, "-").replace(/\\//g, "_").replace(/=+$/, "");
    if (key !== %s || options.userVisibleOnly !== true) return Promise.reject(new Error("wrong applicationServerKey"));
    current = subscription;
    return Promise.resolve(current);
  };
  PushManager.prototype.getSubscription = function () { return Promise.resolve(current); };
})();
"""


@pytest.mark.clause("PUSH-9")
def test_the_page_subscribes_this_device_and_its_service_worker_shows_the_decrypted_push(
    engine: Engine, clock: ManualClock
) -> None:
    """PUSH-9: signed in, "Notify me on this device" registers the worker and PUTs the
    subscription (stored for the participant); a reminder is pushed, the local push service
    decrypts it, and the worker, given that payload, shows its title and body tagged by the
    notification's id; signing out removes the device's subscription."""
    executable = chromium_or_skip()
    from playwright import sync_api

    service = SchedulerService(push_settings(), engine=engine, clock=clock, publisher=RecordingPublisher(),
                               run_scheduler=False)

    async def push_of_the_reminder(push: LocalPushService) -> bytes:
        worker = service.delivery_worker(client=httpx.AsyncClient(transport=push.transport()))
        await worker.run_once()
        [received] = push.received
        assert received.accepted and received.plaintext is not None, received.problems
        await service.stop()
        return received.plaintext

    async def scenario() -> None:
        async with LocalPushService(clock=clock, public_origin=PUSH_ORIGIN) as push:
            browser_side = push.subscribe(application_server_key=VAPID.public_key_b64url)
            backend = FAKE_PUSH_BACKEND % (json.dumps(browser_side.subscription_json()),
                                           json.dumps(VAPID.public_key_b64url))
            with serve(service) as base:
                shown = await asyncio.to_thread(_in_chromium, executable, sync_api, base, backend, engine,
                                                lambda: _dispatch_and_push(service, base, push, push_of_the_reminder))
            [note] = await asyncio.to_thread(rows, engine, "SELECT * FROM notifications")
            assert shown == [[note["title"], note["body"], note["id"]]]

    asyncio.run(asyncio.wait_for(scenario(), timeout=120))


def _dispatch_and_push(service: SchedulerService, base: str, push: LocalPushService, pushed: Any) -> bytes:
    """Store a reminder through the served API, dispatch it, and push it (the worker's own
    event loop, in this thread); the payload the local push service decrypted."""
    response = httpx.post(f"{base}/admin/scheduled-events", headers=INGEST, json=event_body(), timeout=20)
    assert response.status_code == 201, response.text
    drain(service)
    # a thread of its own: Playwright's sync API already runs an event loop in this one
    plaintext: bytes = bounded(lambda: asyncio.run(pushed(push)), 60, "the worker's push")
    return plaintext


def _in_chromium(executable: str, sync_api: Any, base: str, backend: str, engine: Engine,
                 dispatch: Any) -> list[list[str]]:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context()
            context.grant_permissions(["notifications"], origin=base)
            context.add_init_script(backend)
            page = context.new_page()
            cdp = context.new_cdp_session(page)
            registrations: dict[str, str] = {}
            cdp.on("ServiceWorker.workerRegistrationUpdated", lambda event: registrations.update(
                {r["scopeURL"]: r["registrationId"] for r in event["registrations"]}))
            cdp.send("ServiceWorker.enable")
            page.goto(f"{base}/inbox")
            page.fill("#token", token(None, subject="participant-1"))
            page.click("button[type=submit]")
            page.wait_for_selector("#push:not([hidden])", timeout=20_000)
            page.click("#push-on")
            page.wait_for_selector("#push-status:has-text('This device is notified.')", timeout=20_000)
            stored = rows(engine, "SELECT user_id, endpoint FROM push_subscriptions")
            assert [r["user_id"] for r in stored] == ["participant-1"]
            assert stored[0]["endpoint"].startswith(PUSH_ORIGIN + "/push/")

            plaintext = dispatch()
            scope = f"{base}/inbox/"
            wait_for(lambda: scope in registrations, what="the service worker's registration")
            cdp.send("ServiceWorker.deliverPushMessage",
                     {"origin": base, "registrationId": registrations[scope], "data": plaintext.decode()})
            shown: list[list[str]] = []

            def notifications() -> bool:
                shown[:] = page.evaluate(
                    "navigator.serviceWorker.getRegistration('inbox/').then((r) => r.getNotifications())"
                    ".then((ns) => ns.map((n) => [n.title, n.body, n.tag]))")
                return bool(shown)

            wait_for(notifications, what="the service worker to show the push")
            page.click("#sign-out")  # the device stops being notified for this participant
            page.wait_for_selector("#status[data-state=signed-out]", timeout=20_000)
            wait_for(lambda: rows(engine, "SELECT id FROM push_subscriptions") == [],
                     what="signing out to remove this device's subscription")
            return shown
        finally:
            browser.close()
