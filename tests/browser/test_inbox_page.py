"""INBOX-7 — the participant's page in real Chromium, across two replicas.

Replica A runs the polling loop; replica B only serves (no loop). Both are `uvicorn`
servers on 127.0.0.1 over one test database. The page, opened on B, signs in with a
participant token, shows a reminder stored and dispatched through A, and after a
disconnect shows the reminder it missed once it reconnects (Last-Event-ID).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import Engine

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.database.engine import make_engine
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.service import SchedulerService
from tests.conftest import INGEST, T0, token
from tests.helpers import event_body, reminder_facts, rows
from tests.operations.browser import CHROMIUM_ARGS, chromium_or_skip
from tests.servers import serve, wait_for

pytestmark = pytest.mark.browser


@pytest.fixture
def replicas(database_url: str, settings: Settings, clock: ManualClock) -> Iterator[tuple[str, str]]:
    """Replica A (loop every 0.1 s) and replica B (API only), served; their base URLs."""
    engines = [make_engine(database_url, Settings(lock_timeout_ms=0, statement_timeout_ms=60_000)) for _ in range(2)]
    a = SchedulerService(settings.with_(poll_seconds=0.1), engine=engines[0], clock=clock,
                         publisher=RecordingPublisher(), run_scheduler=True)
    b = SchedulerService(settings, engine=engines[1], clock=clock, publisher=RecordingPublisher(),
                         run_scheduler=False)
    try:
        with serve(a) as base_a, serve(b) as base_b:
            yield base_a, base_b
    finally:
        for engine in engines:
            engine.dispose()


def store(base: str, commitment: str, day: str) -> None:
    body = event_body(trigger_at=T0, facts=reminder_facts(day, commitment=commitment))
    response = httpx.post(f"{base}/admin/scheduled-events", headers=INGEST, json=body, timeout=20)
    assert response.status_code == 201, response.text


def streamed(engine: Engine, title: str) -> bool:
    return bool(rows(engine, "SELECT id FROM notifications WHERE title = :t AND stream_seq IS NOT NULL", t=title))


@pytest.mark.clause("INBOX-7")
def test_the_page_on_replica_b_shows_a_reminder_dispatched_by_replica_a_and_what_it_missed_after_a_disconnect(
    replicas: tuple[str, str], engine: Engine, clock: ManualClock
) -> None:
    """INBOX-7: live from another replica, then replayed on reconnect, in real Chromium."""
    executable = chromium_or_skip()
    from playwright import sync_api

    base_a, base_b = replicas
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{base_b}/inbox")
            page.fill("#token", token(None, subject="participant-1"))
            page.click("button[type=submit]")
            page.wait_for_selector("#status[data-state=live]", timeout=20_000)

            started = time.monotonic()
            store(base_a, "run the dishwasher at noon", "2026-11-30")
            page.wait_for_selector("li:has-text('Reminder: run the dishwasher at noon')", timeout=20_000)
            print(f"replica A store -> page on replica B: {time.monotonic() - started:.2f} s "
                  f"(poll interval 0.1 s)")

            page.evaluate("inbox.pause()")
            clock.advance(timedelta(minutes=1))
            store(base_a, "charge the car at 13:00", "2026-12-01")  # another day: not a duplicate
            wait_for(lambda: streamed(engine, "Reminder: charge the car at 13:00"),
                     what="replica A to dispatch and stream the second reminder")
            assert page.locator("li").count() == 1  # disconnected: not shown yet

            page.evaluate("inbox.resume()")
            page.wait_for_selector("li:has-text('Reminder: charge the car at 13:00')", timeout=20_000)
            titles = page.locator("li .title").all_inner_texts()
            assert titles == ["Reminder: charge the car at 13:00", "Reminder: run the dishwasher at noon"]
        finally:
            browser.close()


@pytest.mark.clause("INBOX-14")
def test_the_page_forgets_the_token_at_sign_in_keeps_the_session_over_a_reload_and_signs_out_for_good(
    service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """INBOX-14: after sign-in the text box is empty and the token is nowhere in the page, its URL or
    a script-readable cookie; a reload stays signed in; after sign-out the replayed cookie is refused."""
    executable = chromium_or_skip()
    from playwright import sync_api

    participant = token(None, subject="participant-1")
    with serve(service) as base, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            requested: list[str] = []
            page.on("request", lambda request: requested.append(request.url))
            page.goto(f"{base}/inbox")
            page.fill("#token", participant)
            page.click("button[type=submit]")
            page.wait_for_selector("#status[data-state=live]", timeout=20_000)
            assert page.input_value("#token") == ""
            assert participant not in page.content() and participant not in page.url
            assert all(participant not in url for url in requested)
            assert page.evaluate("document.cookie") == ""  # HttpOnly: no script reads the session
            sync_api.expect(page.locator("#who")).to_have_text("participant-1")

            page.reload()
            page.wait_for_selector("#status[data-state=live]", timeout=20_000)
            sync_api.expect(page.locator("#who")).to_have_text("participant-1")

            [copied] = [c for c in page.context.cookies() if c["name"] == "scheduler_inbox"]
            page.click("#sign-out")
            page.wait_for_selector("#status[data-state=signed-out]", timeout=20_000)
            assert rows(engine, "SELECT id FROM web_sessions") == []
            # the replay: the old cookie's value, put back for this site
            page.context.add_cookies([{"name": copied["name"], "value": copied["value"], "url": base + "/"}])
            page.reload()
            page.wait_for_selector("#signin:not([hidden])", timeout=20_000)
            assert page.evaluate("fetch('me/notifications').then((r) => r.status)") == 401
        finally:
            browser.close()


# Text a sender controls, reaching the notification's title and body through the facts.
HOSTILE = ('<script>window.__pwned = "script"</script><img src=x onerror="window.__pwned = \'img\'">'
           '<b>bold</b> "double" \'single\' &amp; </li><li>')

# Records every Content-Security-Policy violation from the first moment of each page
# (init scripts come from the browser's own protocol, not the page, so the policy allows them).
RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => window.__violations.push(e.effectiveDirective));
"""

# Inject an inline handler the way a rendering bug would, and see what Chromium does with it.
TRY_AN_INLINE_HANDLER = """
() => new Promise((resolve) => {
  document.addEventListener("securitypolicyviolation", (e) => resolve("blocked: " + e.effectiveDirective));
  window.__ran = () => resolve("ran");
  const probe = document.createElement("div");
  probe.innerHTML = '<img src="no-such-image.png" onerror="window.__ran()">';
  document.body.append(probe);
  setTimeout(() => resolve("neither within 5 s"), 5000);
})
"""


@pytest.mark.clause("INBOX-10")
def test_hostile_text_in_a_notification_shows_as_text_on_the_page_and_runs_nothing(
    replicas: tuple[str, str], engine: Engine
) -> None:
    """INBOX-10: a commitment holding <script>, an <img onerror>, markup and quotes reaches a
    notification's title and body; on /inbox in Chromium (live, and again after a reload from
    the list) both show exactly that text, no element of it exists, nothing ran; the page sent
    its policy, broke none of it itself, and Chromium blocks an inline handler injected later."""
    executable = chromium_or_skip()
    from playwright import sync_api

    base_a, base_b = replicas
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context()
            context.set_default_timeout(20_000)
            context.add_init_script(RECORD_VIOLATIONS)
            page = context.new_page()
            response = page.goto(f"{base_b}/inbox")
            assert response is not None
            policy = response.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy
            assert response.headers["x-frame-options"] == "DENY"
            page.fill("#token", token(None, subject="participant-1"))
            page.click("button[type=submit]")
            page.wait_for_selector("#status[data-state=live]")
            store(base_a, HOSTILE, "2026-11-30")
            wait_for(lambda: bool(rows(engine, "SELECT id FROM notifications WHERE stream_seq IS NOT NULL")),
                     what="replica A to dispatch and stream the hostile reminder")
            note = rows(engine, "SELECT title, body FROM notifications")[0]
            assert HOSTILE in note["title"] and HOSTILE in note["body"]  # the sender's text reached both
            for how in ("live", "from the list after a reload"):
                if how != "live":
                    page.reload()  # the page's session keeps it signed in (INBOX-14)
                page.wait_for_selector("#notifications li")
                item = page.locator("#notifications > li")
                assert item.count() == 1, how
                assert item.locator(".title").evaluate("e => e.textContent") == note["title"], how
                assert item.locator("div").nth(1).evaluate("e => e.textContent") == note["body"], how
                assert page.locator("#notifications script, #notifications img, #notifications b").count() == 0, how
                assert page.evaluate("window.__pwned") is None, how
                assert page.evaluate("window.__violations") == [], how  # the page keeps its own policy
            assert page.evaluate(TRY_AN_INLINE_HANDLER).startswith("blocked"), "the policy is not enforced"
        finally:
            browser.close()
