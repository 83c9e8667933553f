"""EMB-10: importing and building the service loads what serving needs, and no more.

A host pays for what it mounts: ``from scheduler import SchedulerService`` and a service built
and asked for its API alone (``app_for("api")``) import neither Alembic (only migrating
needs it) nor the console's pieces (its modules and templates), in a fresh interpreter. (Jinja
itself is loaded either way: the rules' templates are Jinja.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CONSOLE = ("scheduler.web.console.pages", "scheduler.web.console.bulk")
PROBE = f"""
import json, sys
from scheduler import SchedulerService, Settings
service = SchedulerService(Settings(database_url="postgresql+psycopg://nobody@127.0.0.1:9/none",
                                    jwt_secret="x" * 40), run_scheduler=False)
service.app_for("api")
api_only = sorted(m for m in ("alembic", *{CONSOLE!r}) if m in sys.modules)
service.app  # the whole service: the console is built now
whole = sorted(m for m in {CONSOLE!r} if m in sys.modules)
print(json.dumps({{"api_only": api_only, "whole": whole, "modules": len(sys.modules)}}))
"""


@pytest.mark.clause("EMB-10")
def test_the_api_alone_imports_neither_alembic_nor_the_console_and_the_whole_service_builds_the_console() -> None:
    """EMB-10: in a fresh interpreter, a service built with only its API asked for has not
    imported Alembic or the console's modules; asking for the whole ``service.app`` builds
    the console (so the probe would see it if it were there)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCHEDULER_", "OTEL_")) and k != "DATABASE_URL"}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["api_only"] == []
    assert seen["whole"] == sorted(CONSOLE)
