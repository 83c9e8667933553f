"""The distribution (OPS-24): a name of its own on the package index, and a wheel that holds
the service and the harness its ``simulate`` command runs, with their data files, and no
top-level package of the repository's own tools (``bench``, ``reliability``, ``tests``).

``scripts/check-wheel`` (run by ``.ci/run``) goes further: it installs the wheel into a
fresh virtual environment outside the checkout and serves ``/health`` from it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 600  # seconds: pip may fetch the build backend first


def _build_wheel(tmp_path: Path) -> Path:
    """``pip wheel --no-deps`` of a clean copy of the sources (a stale build/ cannot leak in)."""
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    shutil.copytree(ROOT / "src", source / "src", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir",
                    str(tmp_path / "dist"), str(source)], check=True, timeout=BUILD_TIMEOUT, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    return wheel


@pytest.mark.clause("DEC-PKG-1")
@pytest.mark.clause("OPS-24")
def test_the_wheel_is_nudging_scheduler_with_the_service_and_the_harness_and_nothing_else(tmp_path: Path) -> None:
    """OPS-24: the wheel is ``nudging-scheduler`` (``pip install scheduler`` is another
    project); it installs the packages ``scheduler`` and ``harness`` with the SQL, the
    migrations, the pages and the rule examples, the ``scheduler`` command, and no ``bench``."""
    wheel = _build_wheel(tmp_path)
    assert wheel.name.startswith("nudging_scheduler-")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(info).decode())
        entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"scheduler", "harness"}
    assert metadata["Name"] == "nudging-scheduler"
    assert any(r.startswith("pydantic-settings") for r in metadata.get_all("Requires-Dist") or [])
    assert "scheduler = scheduler.cli:main" in entry_points
    for shipped in ("scheduler/database/sql/queries.sql", "scheduler/database/migrations/versions/0001_initial.py",
                    "scheduler/database/migrations/versions/0002_push_subscriptions.py",
                    "scheduler/database/migrations/versions/0003_outbox_fillfactor.py",
                    "scheduler/web/inbox/pages/service-worker.js",
                    "scheduler/database/migrations/script.py.mako", "scheduler/nudging/rules_catalogue/reminders.json",
                    "scheduler/py.typed", "harness/py.typed"):
        assert shipped in names, shipped
    for folder in ("scheduler/web/console/static/", "scheduler/web/console/templates/", "scheduler/web/inbox/pages/"):
        assert any(n.startswith(folder) for n in names), folder
