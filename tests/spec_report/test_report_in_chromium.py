"""The spec report's page in Debian's Chromium with JavaScript off: colours and filters.

With ``SCHEDULER_SCREENSHOTS=1`` the page's screenshot goes to docs/screenshots/ (the report
of the tiny suite of test_report.py: every state at once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.operations.browser import CHROMIUM_ARGS, chromium_or_skip, screenshot
from tests.spec_report.test_report import EXPECTED, make_tiny, reported

pytestmark = pytest.mark.browser

COLOURS = {"proved": "rgb(26, 127, 55)", "broken": "rgb(207, 34, 46)", "unproven": "rgb(179, 89, 0)",
           "not_run": "rgb(110, 119, 129)"}
DEADLINE_MS = 15_000


@pytest.mark.clause("REPORT-9")
def test_the_page_shows_each_clause_in_its_colour_and_filters_by_state_without_javascript(
    pytester: pytest.Pytester, tmp_path: Path,
) -> None:
    """REPORT-9: in Chromium with JavaScript disabled each clause's border has its state's colour
    (proved green, broken red, unproven amber, not run grey) and the "broken" filter leaves
    exactly the broken clauses visible."""
    from playwright.sync_api import sync_playwright

    executable = chromium_or_skip()
    project = make_tiny(pytester)
    reported(project)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, timeout=DEADLINE_MS)
        try:
            context = browser.new_context(java_script_enabled=False, viewport={"width": 1100, "height": 900})
            page = context.new_page()
            page.set_default_timeout(DEADLINE_MS)
            page.goto((project.path / "out" / "index.html").as_uri())
            for cid, state in EXPECTED.items():
                colour = page.locator(f'[id="{cid}"]').evaluate("e => getComputedStyle(e).borderLeftColor")
                assert colour == COLOURS[state], (cid, state, colour)
            screenshot(page, "spec-report-states", tmp_path)
            page.click("label[for=f-broken]")
            visible = page.locator(".clause:visible").evaluate_all("els => els.map(e => e.id)")
            assert sorted(visible) == sorted(cid for cid, state in EXPECTED.items() if state == "broken")
        finally:
            browser.close()
