"""WIRE-9: the suite fails instead of hanging, and its tokens never go stale.

A planted bug once made a spin loop run for twenty minutes; and tokens minted once at
import expire an hour into a long session. These pin the guards against both.
"""

from __future__ import annotations

import importlib.util
import tomllib
from datetime import timedelta
from pathlib import Path

import pytest
from freezegun import freeze_time
from starlette.testclient import TestClient

from tests.conftest import ADMIN, T0

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@pytest.mark.clause("WIRE-9")
def test_every_test_runs_under_a_global_timeout() -> None:
    """WIRE-9: pytest-timeout is installed and configured, so a hang fails the test."""
    options = tomllib.loads(PYPROJECT.read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < int(options["timeout"]) <= 600
    assert importlib.util.find_spec("pytest_timeout") is not None, "the plugin that enforces it"


@pytest.mark.clause("WIRE-9")
def test_the_shared_tokens_are_minted_when_a_request_reads_them(client: TestClient) -> None:
    """WIRE-9: two hours into a session (past a token's one-hour lifetime) ADMIN still works,
    because it is minted for each request, not once at import."""
    with freeze_time(T0 + timedelta(hours=2)):
        assert client.get("/admin/scheduled-events", headers=ADMIN).status_code == 200
