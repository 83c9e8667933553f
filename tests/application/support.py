"""Rows in every status, and the adapters' views of them (API, console, CLI), for the application tests."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from starlette.testclient import TestClient

from scheduler.cli import main
from scheduler.service import SchedulerService
from scheduler.types import EventStatus
from tests.conftest import ADMIN, INGEST, T0
from tests.helpers import drain, post_event

BAD_FACTS = {"facts_version": "1", "scenario": "commitment_reminder", "date": "someday"}


def one_row_per_status(client: TestClient, service: SchedulerService, tag: str = "") -> dict[EventStatus, str]:
    """A row in each status (ids by status): dispatched and failed by a poll, one pending in a
    day, one cancelled by its sender."""
    dispatched = post_event(client, user_id=f"anna{tag}", external_key=f"sent{tag}")["id"]
    failed = post_event(client, user_id=f"ben{tag}", facts=BAD_FACTS, community_id="community-2")["id"]
    drain(service)
    pending = post_event(client, user_id=f"anna{tag}", trigger_at=T0 + timedelta(days=1), event_type="other")["id"]
    cancelled = post_event(client, user_id=f"carl{tag}", trigger_at=T0 + timedelta(days=2))["id"]
    assert client.delete(f"/admin/scheduled-events/{cancelled}", headers=INGEST).status_code == 200
    return {EventStatus.DISPATCHED: dispatched, EventStatus.FAILED: failed, EventStatus.PENDING: pending,
            EventStatus.CANCELLED: cancelled}


def api_ids(client: TestClient, params: dict[str, str]) -> list[str]:
    response = client.get("/admin/scheduled-events", headers=ADMIN, params=params)
    assert response.status_code == 200, response.text
    return [r["id"] for r in response.json()]


def console_ids(client: TestClient, params: dict[str, str]) -> list[str]:
    response = client.get("/console/events", params=params)
    assert response.status_code == 200, response.text
    return re.findall(r'<tr class="status-\w+" data-id="([^"]+)">', response.text)


def cli_ids(params: dict[str, str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    capsys.readouterr()
    options = [part for k, v in params.items() for part in (f"--{k.replace('_', '-')}", v)]
    assert main(["events", "list", "--json", *options]) == 0
    return [r["id"] for r in json.loads(capsys.readouterr().out)]
