"""WIRE-9: the suite fails instead of hanging, and its tokens never go stale.

A planted bug once made a spin loop run for twenty minutes; and tokens minted once at
import expire an hour into a long session. These pin the guards against both.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
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


# -- every wait in the tests has its own deadline -----------------------------------------

TESTS = Path(__file__).resolve().parents[1]
# Methods that block until something happens when called without a timeout: a thread's or a
# process's join/wait, an Event's or Condition's wait, a queue's get, a lock's acquire, a
# future's result, a process's communicate.
BLOCKING_METHODS = {"join", "wait", "get", "acquire", "result", "communicate"}
SUBPROCESS_WAITS = {"run", "call", "check_call", "check_output"}
# A line's comment may say what bounds a wait the scan cannot see (an outer wait_for, a
# thread joined with a deadline): ``# ... bounded: <what bounds it>``.
BOUNDED_NOTE = "bounded:"


def _has_timeout(call: ast.Call) -> bool:
    return any(k.arg == "timeout" for k in call.keywords)


def _bounded_receivers(tree: ast.AST) -> set[str]:
    """Names bound to an object built with a timeout (``threading.Barrier(n, timeout=30)``):
    its ``wait()`` has that deadline."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _has_timeout(node.value):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _tasks(tree: ast.AST) -> set[str]:
    """Names bound to ``asyncio.create_task(...)`` / ``ensure_future(...)``: awaiting one bare waits forever."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in {"create_task", "ensure_future"}:
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _waits_forever(call: ast.Call, bounded_names: set[str]) -> bool:
    """Whether a call without a timeout argument is one of the waits the scan looks for."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    receiver = func.value.id if isinstance(func.value, ast.Name) else None
    return (
        # str.join, dict.get and client.get all take an argument; the blocking forms need none
        (func.attr in BLOCKING_METHODS and not call.args and not call.keywords and receiver not in bounded_names)
        or (func.attr == "communicate" and bool(call.args))
        or (receiver == "subprocess" and func.attr in SUBPROCESS_WAITS)
        or (receiver == "asyncio" and func.attr == "wait")
    )


def unbounded_waits(source: str) -> list[tuple[int, str]]:
    """The waits in ``source`` without a deadline of their own: (line, the call)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    # a wait handed to a call that has a deadline (asyncio.wait_for(event.wait(), 5)) is bounded by it
    inside_deadline: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name == "wait_for" or _has_timeout(node):
                inside_deadline.update(id(arg) for arg in node.args)
    bounded_names, tasks = _bounded_receivers(tree), _tasks(tree)
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Await) and isinstance(node.value, ast.Name) and node.value.id in tasks:
            found.append(node)
        if not isinstance(node, ast.Call) or id(node) in inside_deadline or _has_timeout(node):
            continue
        if _waits_forever(node, bounded_names):
            found.append(node)
    return sorted((n.lineno, ast.unparse(n)[:100]) for n in found if not _noted(lines[n.lineno - 1]))


def _noted(line: str) -> bool:
    """Whether a line's comment says what bounds its wait."""
    return "#" in line and BOUNDED_NOTE in line[line.index("#"):]


@pytest.mark.clause("WIRE-9")
def test_no_wait_in_the_tests_is_without_a_deadline_of_its_own() -> None:
    """WIRE-9: every join, wait, queue get, lock acquire, future result, communicate and
    subprocess run in the tests has a timeout (or is handed to a call that has one, or is on an
    object built with one), and no task created in a test is awaited bare; a wait whose deadline
    is elsewhere says so on its line (``# bounded: ...``). A bug then fails a test in seconds,
    never by the per-test timeout."""
    problems = [f"{path.relative_to(TESTS.parent).as_posix()}:{line}: {call}"
                for path in sorted(TESTS.rglob("*.py")) for line, call in unbounded_waits(path.read_text())]
    assert problems == []


@pytest.mark.clause("WIRE-9")
def test_the_wait_scan_finds_each_kind_of_wait_without_a_deadline() -> None:
    """WIRE-9: the scan itself finds what it looks for, and lets bounded waits be."""
    unbounded = '''
import asyncio, subprocess, threading
async def f(event, queue, thread, proc, lock, future):
    thread.join()
    event.wait()
    queue.get()
    lock.acquire()
    future.result()
    proc.communicate(b"x")
    subprocess.run(["true"])
    await asyncio.wait({future})
    task = asyncio.create_task(f())
    await task
'''
    assert [line for line, _ in unbounded_waits(unbounded)] == [*range(4, 12), 13]
    bounded = '''
import asyncio, subprocess, threading
async def f(event, queue, thread, proc, client):
    thread.join(5)
    event.wait(timeout=5)
    queue.get(timeout=5)
    ", ".join(["a"])
    client.get("/health")
    proc.communicate(b"x", timeout=5)
    subprocess.run(["true"], timeout=5)
    await asyncio.wait_for(event.wait(), 5)
    barrier = threading.Barrier(2, timeout=30)
    barrier.wait()
    task = asyncio.create_task(f())
    await asyncio.wait_for(task, 5)
    await event.wait()  # bounded: the caller's wait_for
'''
    assert unbounded_waits(bounded) == []


def _runs_the_loop(function: ast.AST) -> bool:
    """Whether a function builds an app whose lifespan runs the loop."""
    for node in ast.walk(function):
        if isinstance(node, ast.keyword) and node.arg == "run_scheduler" and \
                isinstance(node.value, ast.Constant) and node.value.value is True:
            return True
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value is True and \
                any(isinstance(t, ast.Attribute) and t.attr == "run_scheduler" for t in node.targets):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "create_app":
            return True
    return False


def lifespans_left_without_a_deadline(source: str) -> list[tuple[int, str]]:
    """``with TestClient(...)`` in a function whose app runs the loop: leaving that block
    waits for the loop to stop, with no deadline (``tests.helpers.running`` has one)."""
    found: list[tuple[int, str]] = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) or not _runs_the_loop(function):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.With):
                for item in node.items:
                    call = item.context_expr
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "TestClient":
                        found.append((node.lineno, ast.unparse(call)))
    return sorted(set(found))


@pytest.mark.clause("WIRE-9")
def test_an_app_whose_lifespan_runs_the_loop_is_left_with_a_deadline() -> None:
    """WIRE-9: leaving ``with TestClient(app)`` waits for the app's shutdown, which waits for
    its loop to stop: a loop that sleeps out its interval would hang there until the per-test
    timeout. Every test whose app runs the loop enters it with ``tests.helpers.running``,
    whose shutdown has a deadline."""
    problems = [f"{path.relative_to(TESTS.parent).as_posix()}:{line}: {call}"
                for path in sorted(TESTS.rglob("test_*.py"))
                for line, call in lifespans_left_without_a_deadline(path.read_text())]
    assert problems == []


# -- the tiers run fast and fundamental first -----------------------------------------------

TIER_ORDER = [
    "tests/test_spec_map.py",  # the map of clauses to tests: source only, under a second
    "tests/smoke",  # a few broad tests of the core path: a core bug fails here, seconds in
    "tests/requirements", "tests/application", "tests/contract", "tests/wiring",
    "tests/spec_report",  # the spec report's own tests: small pytester runs
    "tests/security",
    "tests/operations", "tests/performance", "tests/simulation", "tests/browser",
    "tests/examples",  # the worked examples run for real (uvicorn), before the fault scenarios
    "tests/reliability",
]


def _testpaths() -> list[str]:
    options = tomllib.loads(PYPROJECT.read_text())["tool"]["pytest"]["ini_options"]
    return [str(p) for p in options["testpaths"]]


@pytest.mark.clause("WIRE-11")
def test_the_tiers_are_listed_fast_and_fundamental_first_and_none_is_missing() -> None:
    """WIRE-11: ``testpaths`` lists the tiers in the order the suite should find bugs (the
    requirement tests that prove a clause before the real processes and Chromium), and every
    folder of tests and every test module at the root is in it (a tier left out would
    silently never run under a bare ``pytest``)."""
    assert _testpaths() == TIER_ORDER
    tiers = {path.parent.relative_to(TESTS) for path in TESTS.rglob("test_*.py")}
    top = {f"tests/{t.parts[0]}" if t.parts else "" for t in tiers}
    roots = {f"tests/{p.name}" for p in TESTS.glob("test_*.py")}
    assert (top - {""}) | roots == set(TIER_ORDER)


@pytest.mark.clause("WIRE-11")
def test_pytest_collects_the_testpaths_in_the_order_they_are_listed(tmp_path: Path) -> None:
    """WIRE-11: pytest runs ``testpaths`` in the listed order, not sorted: a project laid out
    like ours, its tiers listed against the alphabet, collects them as listed."""
    listed = ["tests/test_map.py", "tests/zeta", "tests/alpha", "tests/mid"]
    (tmp_path / "pyproject.toml").write_text(
        "[tool.pytest.ini_options]\ntestpaths = [" + ", ".join(f'"{p}"' for p in listed) + "]\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_map.py").write_text("def test_map():\n    pass\n")
    (tmp_path / "tests" / "__init__.py").write_text("")
    for tier in ("zeta", "alpha", "mid"):
        (tmp_path / "tests" / tier).mkdir()
        (tmp_path / "tests" / tier / "__init__.py").write_text("")
        for name in ("test_a.py", "test_b.py"):
            (tmp_path / "tests" / tier / name).write_text("def test_it():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    order = [line.split("::")[0] for line in done.stdout.splitlines() if "::" in line]
    assert order == ["tests/test_map.py", "tests/zeta/test_a.py", "tests/zeta/test_b.py", "tests/alpha/test_a.py",
                     "tests/alpha/test_b.py", "tests/mid/test_a.py", "tests/mid/test_b.py"]
