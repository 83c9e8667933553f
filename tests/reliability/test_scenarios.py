"""REL-7: the fault scenarios' audit can fail, and a scenario runs from one command.

The full scenarios (several thousand events, many faults) are scripts, run by hand or
nightly: ``python -m reliability --help``. Here, CI checks their foundation: the audit
detects a lost, a duplicated and an over-cap outcome, and a small killed-replicas run
passes end to end through real processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from reliability.cluster import ROOT
from reliability.workload import Backlog, audit_backlog, plan_backlog, seed_backlog
from sqlalchemy import Engine, text

from scheduler.config import Settings
from scheduler.core.clock import SystemClock
from scheduler.web.app import SchedulerService
from tests.conftest import TEST_SECRET
from tests.helpers import drain


def _drained(engine: Engine) -> Backlog:
    backlog = plan_backlog(seed=7, events=160, users=12)
    seed_backlog(engine, backlog)
    service = SchedulerService(Settings(jwt_secret=TEST_SECRET), engine=engine, clock=SystemClock(),
                               run_scheduler=False)
    drain(service)
    return backlog


def _execute(engine: Engine, sql: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(sql))


TAMPERING: dict[str, tuple[str, str]] = {
    "lost": ("UPDATE scheduled_events SET status = 'pending', dispatched_at = NULL "
             "WHERE id = (SELECT min(id) FROM scheduled_events WHERE status = 'dispatched')", "still pending"),
    "wrong reason": ("UPDATE scheduled_events SET last_error = 'RuntimeError: boom' "
                     "WHERE id = (SELECT min(id) FROM scheduled_events WHERE status = 'failed')", "another reason"),
    "duplicated": ("INSERT INTO notifications SELECT 'dup-' || id, user_id, community_id, rule_id, kind, scenario, "
                   "time_scope, dedup_key, title, body, status, reason, source, scheduled_event_id, created_at "
                   "FROM notifications WHERE status = 'sent' LIMIT 1", "two sent notifications"),
    "over cap": ("UPDATE notifications SET status = 'sent', reason = NULL WHERE id = "
                 "(SELECT min(id) FROM notifications WHERE reason = 'rate_limited')", "over their cap"),
}


@pytest.mark.clause("REL-7")
@pytest.mark.parametrize("tampering", sorted(TAMPERING))
def test_the_scenario_audit_passes_a_clean_drain_and_catches_each_kind_of_damage(
    engine: Engine, tampering: str
) -> None:
    """REL-7: after an honest drain the audit finds nothing; after one row is damaged it names it."""
    backlog = _drained(engine)
    clean = audit_backlog(engine, backlog)
    assert clean.problems == [] and clean.lost == 0
    assert clean.figures["rate_limited"] > 0 and clean.figures["suppressed_dedup"] > 0 and clean.figures["failed"] > 0
    sql, words = TAMPERING[tampering]
    _execute(engine, sql)
    damaged = audit_backlog(engine, backlog)
    assert any(words in problem for problem in damaged.problems), damaged.problems


def _test_pgdata() -> Path | None:
    """The embedded server the suite already runs (tests/conftest.py), shared by the scenario."""
    if os.environ.get("SCHEDULER_TEST_DATABASE_URL"):
        return None
    return Path(os.environ.get("SCHEDULER_TEST_PGDATA") or Path(tempfile.gettempdir()) / f"scheduler-tests-pg-{os.getuid()}")


@pytest.mark.clause("REL-7")
def test_a_small_killed_replicas_run_passes_end_to_end(tmp_path: Path) -> None:
    """REL-7: `python -m reliability killed-replicas` (300 events, 2 replicas, kill -9 every second)
    exits 0 and reports lost: 0; the full-size figures are in docs/reliability.md."""
    pgdata = _test_pgdata()
    if pgdata is None:
        pytest.skip("the scenario needs the embedded server (SCHEDULER_TEST_DATABASE_URL is set)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    command = [sys.executable, "-m", "reliability", "killed-replicas", "--events", "300", "--replicas", "2",
               "--kill-every", "1", "--seed", "11", "--pgdata", str(pgdata), "--workdir", str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    output: Callable[[], str] = lambda: result.stdout[-3000:] + result.stderr[-3000:]  # noqa: E731
    assert result.returncode == 0, output()
    assert "  lost: 0" in result.stdout and "== killed-replicas: passed" in result.stdout, output()
    kills = next(line for line in result.stdout.splitlines() if line.startswith("  kills: "))
    assert int(kills.split()[1]) >= 1, output()


@pytest.mark.clause("EXP-9")
def test_a_small_expired_backlog_run_ends_every_passed_window_expired_and_dispatches_the_rest(tmp_path: Path) -> None:
    """EXP-9: `python -m reliability expired-backlog` (300 events stored while no replica ran, due
    two hours ago, 40% with a one-hour window): every row ends as planned (expired exactly when its
    window passed, else dispatched or failed for its reason), lost: 0."""
    pgdata = _test_pgdata()
    if pgdata is None:
        pytest.skip("the scenario needs the embedded server (SCHEDULER_TEST_DATABASE_URL is set)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    command = [sys.executable, "-m", "reliability", "expired-backlog", "--events", "300", "--replicas", "2",
               "--seed", "13", "--pgdata", str(pgdata), "--workdir", str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    output: Callable[[], str] = lambda: result.stdout[-3000:] + result.stderr[-3000:]  # noqa: E731
    assert result.returncode == 0, output()
    assert "  lost: 0" in result.stdout and "== expired-backlog: passed" in result.stdout, output()
    figures = dict(line.strip().split(": ", 1) for line in result.stdout.splitlines()
                   if line.startswith("  ") and ": " in line)
    assert int(figures["expired"]) == int(figures["planned_expired"]) > 0, output()
    assert int(figures["dispatched"]) > 0, output()
