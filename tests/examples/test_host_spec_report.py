"""REPORT-10: a host's own spec report, from the installed package's pytest plugin.

examples/fastapi_host has a specification of its own (``specs/host.md``: HOST-1, HOST-2, each
with "Proved by" lines) and a test suite of its own (``tests/``, its tests marked with their
clauses). Run from its own directory, as its CI would, with nothing of this checkout's suite
(no conftest of ours, no ``-p``): the plugin the ``nudging-scheduler`` distribution registers
(``pytest11``) reports the host's clauses, and only those. The suite's database tests take the
plugin's ``scheduler_database_url`` on this session's server. scripts/check-wheel runs the
same suite against the built wheel, installed outside the checkout (on the embedded server).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PgServer, libpq_url

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_host"
pytest.importorskip("fastapi", reason="FastAPI is a test dependency (the example's framework)")


def _host_pytest(server: str, *args: str) -> subprocess.CompletedProcess[str]:
    src = Path(__file__).resolve().parents[2] / "src"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SCHEDULER_", "PYTEST_")) and k not in ("DATABASE_URL", "HOST_TOKEN_SECRET")}
    env["PYTHONPATH"] = str(src)  # the package as installed here (editable); the host's own path is its ini's
    # the plugin's databases on this session's server (else it would start an embedded one)
    env["SCHEDULER_SIM_DATABASE_URL"] = server
    env["SCHEDULER_SIM_SEED"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=EXAMPLE, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.clause("REPORT-10")
@pytest.mark.clause("EMB-23")
def test_the_fastapi_hosts_own_suite_reports_its_own_clauses_with_the_installed_plugin(
    tmp_path: Path, pg_server: PgServer
) -> None:
    """REPORT-10: ``python -m pytest --spec-report DIR`` in the host's directory writes the report
    of the host's clauses (every one proved, by the tests its page lists: its async engine on both
    drivers, its transaction, its facts contract and its simulation among them), none of the
    scheduler's, and ends with the summary line; ``--clause HOST-1`` runs only that clause's tests."""
    server = libpq_url("postgres", host=pg_server.host, port=pg_server.port, user=pg_server.user,
                       password=pg_server.password or None)
    out = tmp_path / "report"
    done = _host_pytest(server, "--spec-report", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith(f"5 clauses: 5 proved — spec report {out}/index.html"), done.stdout
    report = json.loads((out / "report.json").read_text())
    clauses = {clause["id"]: clause for clause in report["clauses"]}
    assert {cid: clause["state"] for cid, clause in clauses.items()} == {
        f"HOST-{n}": "proved" for n in range(1, 6)}
    assert [t["nodeid"] for t in clauses["HOST-2"]["tests"]] == [
        "tests/test_openapi.py::test_one_document_lists_the_hosts_routes_and_the_schedulers_in_production"]
    assert report["pages"] == [{"page": "host.md", "title": "The host's notification service", "state": "proved",
                                "counts": {"proved": 5, "broken": 0, "unproven": 0, "not_run": 0}}]
    assert report["problems"] == []
    assert "HOST-1" in (out / "index.html").read_text()
    one = _host_pytest(server, "--clause", "HOST-1", "-q")
    assert one.returncode == 0, one.stdout + one.stderr
    assert "2 passed" in one.stdout and "test_openapi" not in one.stdout, one.stdout
