"""The console in a real browser: Debian's Chromium driven by Playwright for Python.

In our words: an operator signs in with an admin token, filters the failed rows, opens
one, resets it, bulk resets the rest after the dry-run count, watches the overview change
live when a row fails on another replica, and signs out; without a cookie every page
leads to sign-in, other tokens are refused, a form without its CSRF token is a 403, and
stored HTML or script renders as inert text. The screenshots in docs/console.md come
from these tests (``SCHEDULER_SCREENSHOTS=1``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.core.loop import Scheduler
from scheduler.database.database import Database
from scheduler.operations.heartbeat import Heartbeat
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, T0, TEST_SECRET, token
from tests.helpers import drain, event_row, post_event
from tests.operations.browser import CHROMIUM_ARGS, chromium_or_skip, screenshot, serving
from tests.operations.support import loop_step

pytestmark = pytest.mark.browser

BAD_FACTS = {"facts_version": "1", "scenario": "commitment_reminder", "date": "someday"}
TIMEOUT_MS = 10_000


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    executable = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def settings() -> Settings:
    """The suite's settings, with the overview's stream sending every 0.2 s."""
    return Settings(jwt_secret=TEST_SECRET, poll_seconds=30.0, batch_size=20, console_refresh_seconds=0.2)


@pytest.fixture
def site(service: SchedulerService) -> Iterator[str]:
    with serving(service.app) as base:
        yield base


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    yield page
    context.close()


def browser_sign_in(page: Any, site: str, scope: str | None = "nudging.admin", subject: str = "operator-ann") -> None:
    page.goto(site + "/console")
    assert "/console/sign-in" in page.url
    page.fill("#token", token(scope, subject=subject))
    page.click("#sign-in")


@pytest.mark.clause("CON-1")
@pytest.mark.clause("CON-4")
@pytest.mark.clause("CON-5")
def test_an_operator_signs_in_filters_opens_resets_bulk_resets_and_signs_out(
    page: Any, site: str, client: TestClient, service: SchedulerService, engine: Engine, tmp_path: Path
) -> None:
    """CON-1, CON-4, CON-5: the whole round of an operator, in Chromium."""
    from playwright.sync_api import expect

    failed = [post_event(client, user_id=u, facts=BAD_FACTS)["id"] for u in ("anna", "bob", "carl")]
    post_event(client, user_id="dora")
    drain(service)
    loop_step(service)
    page.goto(site + "/console")
    screenshot(page, "sign-in", tmp_path)
    page.fill("#token", token("nudging.admin", subject="operator-ann"))
    page.click("#sign-in")
    expect(page.locator("#who")).to_have_text("operator-ann")
    expect(page.locator("#failed-count")).to_have_text("3")
    screenshot(page, "overview", tmp_path)

    page.click("text=Events")
    page.select_option("#f-status", "failed")
    page.click("#apply-filter")
    expect(page.locator("#events tbody tr")).to_have_count(3)
    screenshot(page, "events", tmp_path)

    page.locator("#events tbody tr").first.locator("a").click()
    expect(page.locator("#facts")).to_contain_text('"date": "someday"')
    expect(page.locator("#last-error")).to_contain_text("missing_or_invalid_time_scope")
    screenshot(page, "event", tmp_path)
    opened = page.locator("h1 code").inner_text()
    page.fill("#reset-reason", "facts fixed upstream")
    page.click("#reset")
    expect(page.locator("#done")).to_be_visible()
    expect(page.locator("#history")).to_contain_text("facts fixed upstream")
    assert event_row(engine, opened)["status"] == "pending"

    page.goto(site + "/console/events?status=failed")
    expect(page.locator("#events tbody tr")).to_have_count(2)
    page.click("#bulk-reset")
    expect(page.locator("#dry-run-count")).to_have_text("2")
    page.fill("#reason", "rule catalogue fixed")
    screenshot(page, "bulk-reset", tmp_path)
    page.click("#confirm-bulk")
    expect(page.locator("#bulk-count")).to_have_text("2")
    assert sorted(event_row(engine, i)["status"] for i in failed) == ["pending"] * 3

    page.click("text=Audit")
    expect(page.locator("#audit tbody tr")).to_have_count(2)
    expect(page.locator("#audit tbody tr").first).to_contain_text("rule catalogue fixed")
    screenshot(page, "audit", tmp_path)

    page.click("#sign-out")
    assert "/console/sign-in" in page.url
    page.goto(site + "/console/events")
    assert "/console/sign-in" in page.url


@pytest.mark.clause("CON-3")
def test_the_overview_changes_live_when_a_row_fails_on_another_replica(
    page: Any, site: str, client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """CON-3: another replica (its own loop object and heartbeat, same database) fails a row;
    the open overview shows it and the replica without a reload."""
    from playwright.sync_api import expect

    loop_step(service)
    browser_sign_in(page, site)
    expect(page.locator("#failed-count")).to_have_text("0")
    page.evaluate("window.__notReloaded = true")
    post_event(client, user_id="eve", facts=BAD_FACTS, trigger_at=T0 - timedelta(minutes=3))
    other = Scheduler(Database(engine), service.dispatcher, clock, name="replica-b")
    other.poll_hooks.append(Heartbeat(Database(engine), clock))
    other.poll_guarded(lambda: False)
    expect(page.locator("#failed-count")).to_have_text("1")
    expect(page.locator("#replicas")).to_contain_text("replica-b")
    expect(page.locator("#failures")).to_contain_text("missing_or_invalid_time_scope")
    assert page.evaluate("window.__notReloaded") is True


@pytest.mark.clause("CON-1")
def test_in_the_browser_no_cookie_means_sign_in_and_other_tokens_are_refused(page: Any, site: str) -> None:
    """CON-1: each page leads to sign-in; an ingest and a participant token are refused with no cookie set."""
    from playwright.sync_api import expect

    for path in ("/console", "/console/events", "/console/audit"):
        page.goto(site + path)
        assert "/console/sign-in" in page.url
    for scope in ("nudging.ingest", None):
        browser_sign_in(page, site, scope=scope)
        expect(page.locator("#error")).to_contain_text("lacks the admin permission")
        assert [c for c in page.context.cookies() if c["name"] == "scheduler_console"] == []
    browser_sign_in(page, site)
    [cookie] = [c for c in page.context.cookies() if c["name"] == "scheduler_console"]
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, "Strict", "/console")
    assert page.evaluate("document.cookie") == ""  # no script can read the session


@pytest.mark.clause("CON-10")
def test_in_the_browser_a_sign_in_link_to_another_host_lands_on_the_console(page: Any, site: str) -> None:
    """CON-10: an operator follows a link to the sign-in page whose `next` names another host
    (protocol-relative, backslashed, absolute, encoded) or a page beside the console, signs in,
    and Chromium ends on this site's console overview every time."""
    from urllib.parse import quote

    for hostile in ("//evil.example/console", "/\\evil.example/console", "https://evil.example/console",
                    "%2F%2Fevil.example", "/console/%2e%2e/inbox"):
        page.context.clear_cookies()
        page.goto(f"{site}/console/sign-in?next={quote(hostile, safe='')}")
        page.fill("#token", token("nudging.admin", subject="operator-ann"))
        page.click("#sign-in")
        # Wait for where the navigation ends (the POST, its 303, the console), with a deadline
        # of its own; a page that ends elsewhere says what it shows.
        try:
            page.wait_for_url(f"{site}/console", timeout=15_000)
        except Exception as exc:  # playwright's TimeoutError
            raise AssertionError((hostile, page.url, page.inner_text("body")[:300])) from exc


@pytest.mark.clause("CON-2")
def test_in_the_browser_a_form_stripped_of_its_csrf_token_is_403(
    page: Any, site: str, client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """CON-2: the reset form submitted without its hidden CSRF field is refused and the row stays failed."""
    from playwright.sync_api import expect

    bad = post_event(client, user_id="anna", facts=BAD_FACTS)["id"]
    loop_step(service)
    browser_sign_in(page, site)
    page.goto(f"{site}/console/events/{bad}")
    page.evaluate("document.querySelector('#reset-form input[name=csrf]').remove()")
    with page.expect_navigation() as navigation:
        page.click("#reset")
    assert navigation.value.status == 403
    expect(page.locator("#error")).to_contain_text("CSRF")
    assert event_row(engine, bad)["status"] == "failed"


HOSTILE = '<script>window.__pwned = "script"</script><img src=x onerror="window.__pwned = \'img\'"><b>bold</b>'


class HostileDispatcher:
    """A fake at the dispatcher edge whose error message is HTML."""

    def __call__(self, session: Any, event: Any, now: Any) -> Any:
        raise RuntimeError(HOSTILE)


@pytest.mark.clause("CON-7")
def test_hostile_facts_and_errors_render_as_inert_text_in_the_browser(
    page: Any, site: str, client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """CON-7: facts and last_error holding script and HTML show as text on the detail, events and
    overview pages, including the overview's live updates; nothing runs."""
    from playwright.sync_api import expect

    bad = post_event(client, user_id="mallory", facts={"facts_version": "1.0", "scenario": "commitment_reminder",
                                                       "date": "2026-11-30", "commitment": HOSTILE})["id"]
    service.scheduler.dispatcher = HostileDispatcher()
    loop_step(service)
    with engine.begin() as conn:  # a replica whose heartbeat error is HTML too, shown by the live update
        conn.execute(text("UPDATE scheduler_replicas SET last_error = :e, consecutive_failures = 1"), {"e": HOSTILE})
        conn.execute(text("UPDATE scheduled_events SET last_error = :e WHERE id = :id"),
                     {"e": HOSTILE + ": x", "id": bad})
    browser_sign_in(page, site)
    expect(page.locator("#replicas")).to_contain_text("<script>")  # after the stream's update, as text
    expect(page.locator("#failures")).to_contain_text("<img src=x")
    page.goto(f"{site}/console/events/{bad}")
    expect(page.locator("#facts")).to_contain_text("<script>window.__pwned")
    expect(page.locator("#last-error")).to_contain_text("<img src=x onerror=")
    page.goto(f"{site}/console/events?status=failed")
    expect(page.locator("#events")).to_contain_text("<b>bold</b>")
    for path in ("/console", f"/console/events/{bad}", "/console/events?status=failed"):
        page.goto(site + path)
        page.wait_for_load_state("load")
        assert page.evaluate("window.__pwned") is None, path
        assert page.locator("main img, main script, main b").count() == 0, path


@pytest.mark.clause("CON-11")
def test_after_sign_out_the_replayed_old_cookie_is_refused_in_the_browser(
    page: Any, site: str, client: TestClient, tmp_path: Path
) -> None:
    """CON-11: the session cookie, copied before sign-out and put back after it, leads to sign-in."""
    from playwright.sync_api import expect

    browser_sign_in(page, site)
    expect(page.locator("#who")).to_have_text("operator-ann")
    page.click("text=Sessions")
    expect(page.locator("#sessions tbody tr")).to_have_count(1)
    expect(page.locator("#sessions")).to_contain_text("(you)")
    screenshot(page, "sessions", tmp_path)
    [copied] = [c for c in page.context.cookies() if c["name"] == "scheduler_console"]
    page.click("#sign-out")
    assert "/console/sign-in" in page.url
    assert [c for c in page.context.cookies() if c["name"] == "scheduler_console"] == []
    page.context.add_cookies([copied])  # the replay: the old cookie, exactly as it was
    page.goto(site + "/console/events")
    assert "/console/sign-in" in page.url
    expect(page.locator("#sign-in")).to_be_visible()
    assert client.get("/admin/sessions", headers=ADMIN).json() == []


@pytest.mark.clause("CON-12")
def test_an_expired_session_leads_the_browser_to_sign_in(
    page: Any, site: str, service: SchedulerService, clock: ManualClock
) -> None:
    """CON-12: past the idle timeout (the service's clock moved on) the next page is the sign-in page,
    and signing in again returns to that page."""
    from playwright.sync_api import expect

    browser_sign_in(page, site)
    expect(page.locator("#who")).to_have_text("operator-ann")
    clock.advance(timedelta(seconds=service.settings.session_idle_seconds + 1))
    page.goto(site + "/console/audit")
    assert "/console/sign-in?next=%2Fconsole%2Faudit" in page.url
    page.fill("#token", token("nudging.admin", subject="operator-ann"))
    page.click("#sign-in")
    expect(page.locator("#audit")).to_be_visible()
    assert page.url.endswith("/console/audit")


@pytest.mark.clause("CON-14")
@pytest.mark.clause("CON-15")
def test_an_operator_cancels_one_event_from_its_page_and_the_rest_by_filter_after_the_dry_run(
    page: Any, site: str, client: TestClient, service: SchedulerService, engine: Engine, tmp_path: Path
) -> None:
    """CON-14, CON-15: in Chromium, one pending reminder is cancelled from its page with a reason; then
    the dry run counts the participant's other cancellable rows and the confirmed cancel takes them all."""
    from playwright.sync_api import expect

    later = T0 + timedelta(hours=2)
    pending = [post_event(client, user_id="mia", external_key=f"mia-{n}", trigger_at=later)["id"] for n in range(3)]
    failed = post_event(client, user_id="mia", facts=BAD_FACTS)["id"]
    other = post_event(client, user_id="noah", trigger_at=later)["id"]
    drain(service)
    browser_sign_in(page, site)
    expect(page.locator("#who")).to_have_text("operator-ann")

    page.goto(f"{site}/console/events/{pending[0]}")
    page.fill("#cancel-reason", "asked by the participant")
    screenshot(page, "cancel", tmp_path)
    page.click("#cancel")
    expect(page.locator("#done")).to_contain_text("Cancelled")
    expect(page.locator("#history")).to_contain_text("asked by the participant")
    expect(page.locator("#cancel-form")).to_have_count(0)
    assert event_row(engine, pending[0])["status"] == "cancelled"

    page.goto(site + "/console/events")
    page.fill("#f-user", "mia")
    page.click("#apply-filter")
    expect(page.locator("#events tbody tr")).to_have_count(4)
    page.click("#bulk-cancel")
    expect(page.locator("#dry-run-count")).to_have_text("3")  # the cancelled one is not counted again
    page.fill("#reason", "participant left the programme")
    screenshot(page, "bulk-cancel", tmp_path)
    page.click("#confirm-bulk-cancel")
    expect(page.locator("#bulk-cancel-count")).to_have_text("3")
    assert [event_row(engine, i)["status"] for i in [*pending, failed]] == ["cancelled"] * 4
    assert event_row(engine, other)["status"] == "pending"
    page.click("text=Audit")
    expect(page.locator("#audit tbody tr")).to_have_count(2)
    expect(page.locator("#audit tbody tr").first).to_contain_text("bulk_cancel")
