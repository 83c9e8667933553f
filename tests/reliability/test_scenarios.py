"""REL-7, REL-17: the fault scenarios' audit can fail, and every scenario runs, small, in CI.

The full scenarios (several thousand events, many faults) are scripts, run by hand or
nightly: ``python -m reliability --help``. Here, CI checks their foundation (the audit
detects a lost, a duplicated and an over-cap outcome) and runs every scenario at a small
size through real processes: here killed-replicas, database-restart, slow-database, shutdown
and fuzz; partition and clock-skew in test_frozen_and_skewed_replicas.py, pgbouncer in
test_pgbouncer.py, failover in test_failover.py. A registry test fails if a registered scenario has no such run.
"""

from __future__ import annotations

import ast
import importlib
import shutil
import tempfile
from pathlib import Path

import pytest
from reliability.__main__ import SCENARIOS
from reliability.cluster import ROOT, stop_server
from reliability.workload import Backlog, audit_backlog, plan_backlog, seed_backlog
from sqlalchemy import Engine, text

from scheduler.config import Settings
from scheduler.core.clock import SystemClock
from scheduler.service import SchedulerService
from tests.conftest import TEST_SECRET
from tests.helpers import drain
from tests.reliability.scenarios import run_small_scenario, suite_pgdata


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


@pytest.mark.clause("REL-7")
def test_a_small_killed_replicas_run_passes_end_to_end(tmp_path: Path) -> None:
    """REL-7: `python -m reliability killed-replicas` (300 events, 2 replicas, kill -9 every second)
    exits 0 and reports lost: 0; the full-size figures are in docs/reliability.md."""
    run = run_small_scenario("killed-replicas", ["--events", "300", "--replicas", "2", "--kill-every", "1",
                                                 "--seed", "11"], tmp_path, timeout=300)
    assert run.figures["kills"] >= 1, run.output()


@pytest.mark.clause("REL-2")
@pytest.mark.clause("REL-17")
def test_a_small_database_restart_run_passes_end_to_end(tmp_path: Path) -> None:
    """REL-2, REL-17: `python -m reliability database-restart` (300 events, PostgreSQL stopped for
    2 s once, replica backends terminated twice, 2 POSTing clients) on a server of its own (it
    stops the server, which the suite's other tests share): every replica survives, its health
    showed the outage (503 failing) and recovered, nothing lost, every 201 in the table."""
    # Not under tmp_path: the server runs as another user when root, and every pytest session
    # starting meanwhile (the machine's others) makes pytest's own temporary root private again.
    own = Path(tempfile.mkdtemp(prefix="scheduler-restart-pg-")) / "pg"
    try:
        run = run_small_scenario("database-restart", ["--events", "300", "--replicas", "2", "--clients", "2",
                                                      "--outage", "2", "--restarts", "1", "--terminations", "2",
                                                      "--seed", "13"], tmp_path, timeout=300, pgdata=own)
    finally:
        stop_server(own)  # started again by the scenario itself: nobody else stops it
        stopped = not (own / "postmaster.pid").exists()
        shutil.rmtree(own.parent, ignore_errors=True)
    assert stopped, "the scenario's own server was left running"
    assert run.figures["database_restarts"] == 1 and run.figures["backends_terminated"] >= 1, run.output()
    assert run.figures["health_503_samples"] > 0 and run.figures["acknowledged_201"] > 0, run.output()


@pytest.mark.clause("REL-3")
@pytest.mark.clause("REL-4")
@pytest.mark.clause("REL-17")
@pytest.mark.parametrize("seed", [14, 2, 7])
def test_a_small_slow_database_run_passes_end_to_end(tmp_path: Path, seed: int) -> None:
    """REL-3, REL-4, REL-17: `python -m reliability slow-database` (600 events, each lock held
    2 s, 2 POSTing clients), on three seeds: during the table lock each replica's admin health
    named its own timeout (lock, statement) and POSTs answered 503; during one participant's
    advisory lock, its 60 rows due before every other (so every claim meets them first), the
    others kept going at no less than half the rate without a hold and its rows stayed
    untouched; nothing lost. A claim that waits on a busy participant, or gives up at one,
    makes no progress at all here."""
    run = run_small_scenario("slow-database", ["--events", "600", "--clients", "2", "--hold", "2",
                                               "--seed", str(seed)], tmp_path, timeout=300)
    assert run.figures["held_participant_rows"] == 60, run.output()
    assert run.figures["pending_at_advisory_lock"] > 0, run.output()
    assert run.figures["progress_during_advisory_lock"] > 0, run.output()


@pytest.mark.clause("REL-5")
@pytest.mark.clause("REL-17")
def test_a_small_shutdown_run_passes_end_to_end(tmp_path: Path) -> None:
    """REL-5, REL-17: `python -m reliability shutdown` (600 events, 2 replicas, 3 SIGTERMs, each
    restarted): every SIGTERM ends in a clean lifespan shutdown and exit 0, no backend of the
    replica is left, and the audit finds every event done exactly once."""
    run = run_small_scenario("shutdown", ["--events", "600", "--replicas", "2", "--rounds", "3", "--seed", "15"],
                             tmp_path, timeout=300)
    assert run.figures["sigterms"] >= 1 and run.figures["graceful_shutdowns"] == run.figures["sigterms"], run.output()


@pytest.mark.clause("SEC-17")
@pytest.mark.clause("REL-17")
def test_a_small_fuzz_run_passes_end_to_end(tmp_path: Path) -> None:
    """SEC-17, REL-17: `python -m reliability fuzz` with 2 examples per operation and generation
    mode (its pytest run on the suite's embedded server): no 5xx, the figures name the cases."""
    pgdata = suite_pgdata()
    run = run_small_scenario("fuzz", ["--examples", "2", "--seed", "16"], tmp_path, timeout=600,
                             env={"SCHEDULER_TEST_PGDATA": str(pgdata)} if pgdata else None)
    assert run.figures["cases"] > 0, run.output()


def _small_runs_in_tests() -> dict[str, list[str]]:
    """Scenario name -> the tests that call ``run_small_scenario`` with it written out, read
    from the source of every test module (not from a pytest run: the check holds whatever
    subset of the suite is selected)."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.name.startswith("test_"):
                continue
            for call in ast.walk(node):
                if (isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Constant)
                        and isinstance(call.args[0].value, str)
                        and (getattr(call.func, "id", None)
                             or getattr(call.func, "attr", None)) == "run_small_scenario"):
                    found.setdefault(call.args[0].value, []).append(f"{path.relative_to(ROOT)}::{node.name}")
    return found


@pytest.mark.clause("REL-17")
def test_every_registered_scenario_runs_small_in_ci_and_every_scenario_module_is_registered() -> None:
    """REL-17: each scenario of `python -m reliability` (reliability.__main__.SCENARIOS) has a
    test that runs it at a small size through run_small_scenario, and every module of
    reliability/ that defines a scenario (add_arguments and run) is registered, so that none
    can rot unseen."""
    registered = {name: module for name, module, _ in SCENARIOS}
    scenario_modules = set()
    for path in (ROOT / "reliability").glob("*.py"):
        defined = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        if {"add_arguments", "run"} <= defined:
            scenario_modules.add(path.stem)
    assert scenario_modules == set(registered.values()), "a scenario module is not in SCENARIOS, or the reverse"
    for _, module, _ in SCENARIOS:
        imported = importlib.import_module(f"reliability.{module}")
        assert callable(imported.add_arguments) and callable(imported.run), module
    runs = _small_runs_in_tests()
    missing = sorted(set(registered) - set(runs))
    assert not missing, f"scenarios without a small run in CI: {missing} (add a test calling run_small_scenario)"
    unknown = sorted(set(runs) - set(registered))
    assert not unknown, f"small runs of scenarios that are not registered: {unknown}"


@pytest.mark.clause("EXP-9")
@pytest.mark.clause("REL-17")
def test_a_small_expired_backlog_run_ends_every_passed_window_expired_and_dispatches_the_rest(tmp_path: Path) -> None:
    """EXP-9, REL-17: `python -m reliability expired-backlog` (300 events stored while no replica
    ran, due two hours ago, 40% with a one-hour window): every row ends as planned (expired
    exactly when its window passed, else dispatched or failed for its reason), lost: 0."""
    run = run_small_scenario("expired-backlog", ["--events", "300", "--replicas", "2", "--seed", "13"],
                             tmp_path, timeout=300)
    assert run.figures["expired"] == run.figures["planned_expired"], run.output()
    assert isinstance(run.figures["expired"], int) and run.figures["expired"] > 0, run.output()
    assert isinstance(run.figures["dispatched"], int) and run.figures["dispatched"] > 0, run.output()
