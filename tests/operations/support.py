"""Builders shared by the operations tests (heartbeats, metrics, console)."""

from __future__ import annotations

import re
from typing import Any

from starlette.testclient import TestClient

from scheduler.operations.metrics import parse_exposition
from scheduler.service import SchedulerService
from tests.conftest import token


def loop_step(service: SchedulerService) -> None:
    """One poll exactly as the loop runs it: guarded, then the poll hooks (heartbeat, metrics)."""
    service.scheduler.poll_guarded(lambda: False)


def scrape(client: TestClient, **headers: str) -> dict[str, Any]:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse_exposition(response.text)


def sign_in(client: TestClient, scope: str | None = "nudging.admin", subject: str = "operator-ann",
            ttl_seconds: int = 3600) -> str:
    """Sign in on the console as a browser would; return the page's CSRF token."""
    page = client.get("/console/sign-in")
    nonce = re.search(r'name="nonce" value="([^"]+)"', page.text)
    assert nonce, page.text
    signed = token(scope, subject=subject, ttl_seconds=ttl_seconds)
    response = client.post("/console/sign-in", data={"nonce": nonce[1], "token": signed, "next": ""},
                           follow_redirects=False)
    assert response.status_code == 303, response.text
    return csrf_of(client.get("/console").text)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF field on the page"
    return found[1]
