"""The spec report and the selection by clause, run over a tiny suite of their own (pytester):
a passing, a failing, a skipped, an xfailed and a parametrized test, and a tiny specs/."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

import harness.spec_report
from harness.spec_report.__main__ import main as rebuild
from tests.spec_report.schema_check import validate

SCHEMA = Path(harness.spec_report.__file__).with_name("report.schema.json")

SCHEDULING = """\
# Tiny scheduling
## REQ-0065 — the loop takes due rows
The requirement in a sentence. Shaped by DEC-1.

### REQ-0065.1 — A clause whose one test passes.
Proved by:
- tests/test_tiny_suite.py::test_passes

### REQ-0065.2 — A clause with a passing and a failing test.
Proved by:
- tests/test_tiny_suite.py::test_passes
- tests/test_tiny_suite.py::test_fails

### REQ-0065.3 — A clause whose test is skipped.
Proved by:
- tests/test_tiny_suite.py::test_skipped

### REQ-0065.4 — A clause whose parametrized test fails in one variant of three.
Proved by:
- tests/test_tiny_suite.py::test_variants

### REQ-0065.5 — A clause whose test is an expected failure.
Proved by:
- tests/test_tiny_suite.py::test_expected_to_fail
"""
CONTEXT = """\
# Tiny context
## Facts (REQ-0012)
### CTX-FACTS.1 — A context clause, proved.
Proved by:
- tests/test_tiny_suite.py::test_passes
"""
OWN = """\
# Tiny own clauses
### OWN-1 — A clause whose test lives in a module this run does not collect.
Proved by:
- tests/test_tiny_other.py::test_elsewhere

### OWN-2 — A clause proved by every variant of a parametrized test.
Proved by:
- tests/test_tiny_suite.py::test_all_variants_pass
"""
DECISIONS = """\
# Tiny decisions
### DEC-1 — A decision that REQ-0065.1 follows.
Proved by:
- tests/test_tiny_suite.py::test_passes
"""
SUITE = """\
import pytest

@pytest.mark.clause("REQ-0065.1")
@pytest.mark.clause("REQ-0065.2")
@pytest.mark.clause("CTX-FACTS.1")
@pytest.mark.clause("DEC-1")
def test_passes():
    pass

@pytest.mark.clause("REQ-0065.2")
def test_fails():
    assert 1 + 1 == 3, "arithmetic is broken"

@pytest.mark.clause("REQ-0065.3")
def test_skipped():
    pytest.skip("no Chromium on this machine")

@pytest.mark.clause("REQ-0065.4")
@pytest.mark.parametrize("n", [1, 2, 3])
def test_variants(n):
    assert n != 2

@pytest.mark.clause("REQ-0065.5")
@pytest.mark.xfail(reason="waits on the database fix")
def test_expected_to_fail():
    assert False

@pytest.mark.clause("OWN-2")
@pytest.mark.parametrize("n", [1, 2])
def test_all_variants_pass(n):
    assert n

def test_proves_nothing():
    pass
"""
# Collecting this module fails: a run that selects by clause must not even import it.
OTHER = """\
import a_module_that_does_not_exist

def test_elsewhere():
    pass
"""

EXPECTED = {
    "REQ-0065.1": "proved", "REQ-0065.2": "broken", "REQ-0065.3": "unproven", "REQ-0065.4": "broken",
    "REQ-0065.5": "unproven", "CTX-FACTS.1": "proved", "OWN-1": "not_run", "OWN-2": "proved",
    "DEC-1": "proved",
}


@pytest.fixture
def tiny(pytester: pytest.Pytester) -> pytest.Pytester:
    return make_tiny(pytester)


def make_tiny(pytester: pytest.Pytester) -> pytest.Pytester:
    """A temporary project: tests/ with the tiny suite, specs/ with its pages (own page first by
    name, so the report's order is its own doing)."""
    pytester.makeini("[pytest]\n")
    specs = pytester.mkdir("specs")
    for name, text in {"scheduling.md": SCHEDULING, "dispatch-path.md": CONTEXT, "a-own.md": OWN,
                       "decisions.md": DECISIONS}.items():
        (specs / name).write_text(text)
    tests = pytester.mkdir("tests")
    (tests / "test_tiny_suite.py").write_text(SUITE)
    (tests / "test_tiny_other.py").write_text(OTHER)
    return pytester


def run(tiny: pytest.Pytester, *args: str) -> pytest.RunResult:
    return tiny.runpytest(*args)  # the plugin is the wheel's entry point, loaded in every run


def reported(tiny: pytest.Pytester) -> tuple[pytest.RunResult, dict[str, Any], str]:
    result = run(tiny, "--spec-report", "out", "tests/test_tiny_suite.py")
    out = tiny.path / "out"
    return result, json.loads((out / "report.json").read_text()), (out / "index.html").read_text()


@pytest.mark.clause("REPORT-1")
def test_the_report_lists_every_clause_with_its_words_page_requirement_decisions_and_tests(
    tiny: pytest.Pytester,
) -> None:
    """REPORT-1: every clause of specs/ is in report.json with its words, page, requirement, kind,
    decisions and each test with its variants, seed requirements first, decisions last."""
    _, report, _ = reported(tiny)
    clauses = {clause["id"]: clause for clause in report["clauses"]}
    assert set(clauses) == set(EXPECTED)
    first = clauses["REQ-0065.1"]
    assert (first["words"], first["page"], first["kind"]) == (
        "A clause whose one test passes.", "scheduling.md", "seed")
    assert first["decisions"] == ["DEC-1"]
    assert [clause["kind"] for clause in report["clauses"]] == ["seed"] * 5 + ["context", "own", "own", "decision"]
    requirements = report["requirements"]
    assert [(r["id"], r["kind"]) for r in requirements] == [
        ("REQ-0065", "seed"), (None, "context"), (None, "own"), (None, "decision")]
    assert requirements[0]["decisions"] == ["DEC-1"]
    assert requirements[0]["opening"] == "The requirement in a sentence. Shaped by DEC-1."
    variants = clauses["REQ-0065.4"]["tests"][0]
    assert variants["nodeid"] == "tests/test_tiny_suite.py::test_variants"
    assert [(r["nodeid"].split("[")[1], r["outcome"]) for r in variants["runs"]] == [
        ("1]", "passed"), ("2]", "failed"), ("3]", "passed")]
    assert clauses["OWN-1"]["tests"] == [{"nodeid": "tests/test_tiny_other.py::test_elsewhere", "listed": True,
                                          "outcome": "not_run", "duration_seconds": 0, "runs": []}]


@pytest.mark.clause("REPORT-2")
def test_a_failing_and_a_skipped_test_colour_exactly_their_clauses(tiny: pytest.Pytester) -> None:
    """REPORT-2: a failed test (or one failed variant) makes its clauses broken, a skipped or
    xfailed one unproven with its reason, a test not in the run leaves its clause not run, and
    only clauses whose every test passed are proved: in the JSON and in the page's colours."""
    result, report, page = reported(tiny)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert {clause["id"]: clause["state"] for clause in report["clauses"]} == EXPECTED
    coloured = dict((cid, state) for state, cid in re.findall(r'<div class="clause (\w+)" id="([^"]+)"', page))
    assert coloured == EXPECTED
    clauses = {clause["id"]: clause for clause in report["clauses"]}
    assert clauses["REQ-0065.3"]["reasons"] == ["no Chromium on this machine"]
    assert clauses["REQ-0065.5"]["reasons"] == ["xfailed: waits on the database fix"]
    failed = clauses["REQ-0065.2"]["tests"][1]["runs"][0]["failure"]
    assert failed["phase"] == "call"
    assert failed["location"] == "tests/test_tiny_suite.py:12"
    assert failed["lines"][0] == "AssertionError: arithmetic is broken"
    assert report["summary"] | {"line": ""} == {"clauses": 9, "proved": 4, "broken": 2, "unproven": 2,
                                                 "not_run": 1, "line": ""}
    pages = {p["page"]: (p["state"], p["counts"]) for p in report["pages"]}
    assert pages["scheduling.md"] == ("broken", {"proved": 1, "broken": 2, "unproven": 2, "not_run": 0})
    assert pages["decisions.md"] == ("proved", {"proved": 1, "broken": 0, "unproven": 0, "not_run": 0})
    assert pages["a-own.md"][0] == "not_run"


@pytest.mark.clause("REPORT-2")
def test_a_module_that_fails_to_import_breaks_the_clauses_of_its_tests(tiny: pytest.Pytester) -> None:
    """REPORT-2: a test whose module cannot be collected failed, so its clause is broken, with the
    collection error's last lines, rather than not run."""
    run(tiny, "--spec-report", "out", "tests/test_tiny_suite.py", "tests/test_tiny_other.py")
    report = json.loads((tiny.path / "out" / "report.json").read_text())
    clause = next(clause for clause in report["clauses"] if clause["id"] == "OWN-1")
    assert clause["state"] == "broken"
    (failed,) = clause["tests"][0]["runs"]
    assert failed["failure"]["phase"] == "collect"
    assert failed["failure"]["lines"][-1] == "E   ModuleNotFoundError: No module named 'a_module_that_does_not_exist'"
    assert validate(report, json.loads(SCHEMA.read_text())) == []


@pytest.mark.clause("REPORT-3")
def test_the_run_ends_with_the_one_line_summary(tiny: pytest.Pytester) -> None:
    """REPORT-3: the last line of the run's output is the summary: the counts, the broken clauses
    by ID, the unproven ones by reason, and where the page is."""
    result, report, _ = reported(tiny)
    last = result.outlines[-1]
    assert last.startswith(
        "9 clauses: 4 proved, 2 broken (REQ-0065.2, REQ-0065.4), 2 unproven (no Chromium on this machine: "
        "REQ-0065.3; xfailed: waits on the database fix: REQ-0065.5), 1 not run — spec report "), last
    assert last.startswith(report["summary"]["line"])
    assert "— spec report out/index.html (" in last


@pytest.mark.clause("REPORT-4")
def test_the_report_json_validates_against_the_schema_in_the_repository(tiny: pytest.Pytester) -> None:
    """REPORT-4: report.json satisfies the schema shipped beside the plugin
    (src/harness/spec_report/report.schema.json), and the schema is
    strict enough that a wrong state or a missing field is caught."""
    schema = json.loads(SCHEMA.read_text())
    _, report, _ = reported(tiny)
    assert validate(report, schema) == []
    broken = json.loads(json.dumps(report))
    broken["clauses"][0]["state"] = "green"
    del broken["clauses"][1]["tests"][0]["runs"][0]["outcome"]
    broken["summary"]["extra"] = 1
    assert validate(broken, schema) == [
        "$.summary: 'extra' is not a property the schema allows",
        "$.clauses[0].state: 'green' is not one of ['proved', 'broken', 'unproven', 'not_run']",
        "$.clauses[1].tests[0].runs[0]: 'outcome' is required",
    ]
    try:
        import jsonschema_rs  # schemathesis's validator: a second opinion on the schema itself
    except ImportError:
        return
    assert list(jsonschema_rs.validator_for(schema).iter_errors(report)) == []
    assert not jsonschema_rs.validator_for(schema).is_valid(broken)


@pytest.mark.clause("REPORT-5")
def test_the_page_is_self_contained_and_needs_no_script(tiny: pytest.Pytester) -> None:
    """REPORT-5: index.html has no script and fetches nothing (no external stylesheet, image,
    font or link off the page); every in-page link has its target."""
    _, _, page = reported(tiny)
    assert "<script" not in page.lower()
    assert re.findall(r"""(?:src|href)\s*=\s*["'](?!#)([^"']*)""", page) == []
    assert "url(" not in page and "@import" not in page and "<link" not in page
    targets = set(re.findall(r'id="([^"]+)"', page))
    assert set(re.findall(r'href="#([^"]+)"', page)) <= targets
    assert 'type="radio"' in page  # the filters: CSS over radio inputs


@pytest.mark.clause("REPORT-6")
def test_clause_selects_exactly_the_tests_that_prove_it(tiny: pytest.Pytester) -> None:
    """REPORT-6: --clause ID runs only the tests that prove it; repeated, their union; a prefix
    (REQ-0065) the whole requirement; a module proving none of them is not even imported."""
    result = run(tiny, "--clause", "REQ-0065.3")
    result.assert_outcomes(skipped=1, deselected=9)
    result = run(tiny, "--clause", "REQ-0065.1", "--clause", "OWN-2", "-v")
    result.assert_outcomes(passed=3, deselected=7)
    assert sorted(re.findall(r"::(test_\w+)\S* PASSED", result.stdout.str())) == [
        "test_all_variants_pass", "test_all_variants_pass", "test_passes"]
    result = run(tiny, "--clause", "REQ-0065")
    result.assert_outcomes(passed=3, failed=2, skipped=1, xfailed=1, deselected=3)


@pytest.mark.clause("REPORT-6")
def test_an_unknown_clause_is_a_usage_error_that_names_it(tiny: pytest.Pytester) -> None:
    """REPORT-6: a --clause value that is no clause's ID or prefix stops the run before any test,
    naming it (REQ-006 is not a prefix of REQ-0065: prefixes end at a '.' or '-')."""
    result = run(tiny, "--clause", "REQ-0065.1", "--clause", "REQ-0099", "--clause", "REQ-006")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--clause REQ-0099, REQ-006: no clause of" in result.stderr.str()
    assert "test session starts" not in result.stdout.str()  # stopped before collecting


@pytest.mark.clause("REPORT-7")
def test_the_page_is_rebuilt_from_report_json_without_running_a_test(
    tiny: pytest.Pytester, capsys: pytest.CaptureFixture[str],
) -> None:
    """REPORT-7: python -m harness.spec_report DIR writes the same index.html from DIR/report.json."""
    _, report, page = reported(tiny)
    out = tiny.path / "out"
    (out / "index.html").unlink()
    capsys.readouterr()
    assert rebuild([str(out)]) == 0
    assert (out / "index.html").read_text() == page
    assert capsys.readouterr().out.startswith(report["summary"]["line"])
    with pytest.raises(SystemExit):
        rebuild([str(tiny.path / "nowhere")])
    assert "nowhere/report.json does not exist" in capsys.readouterr().err


HOST_PAGE = """\
# A host's promises
### HOST-1 — The host's first promise, proved.
Proved by:
- checks/test_host.py::test_first_promise

### HOST-2 — The host's second promise, broken.
Proved by:
- checks/test_host.py::test_second_promise

### HOST-3 — A promise whose test module cannot be imported.
Proved by:
- checks/test_broken_module.py::test_third_promise
"""
HOST_SUITE = """\
import pytest

@pytest.mark.clause("HOST-1")
def test_first_promise():
    pass

@pytest.mark.clause("HOST-2")
def test_second_promise():
    assert "promise" == "kept"
"""
HOST_INI = """\
[pytest]
testpaths = checks
scheduler_specs = docs/promises
"""


def make_host(pytester: pytest.Pytester) -> pytest.Pytester:
    """A host's project: its spec pages in docs/promises (named by the ini option), its tests in
    checks/ (named by testpaths), none of the checkout's clauses."""
    pytester.makeini(HOST_INI)
    (pytester.mkdir("docs") / "promises").mkdir()
    (pytester.path / "docs" / "promises" / "host.md").write_text(HOST_PAGE)
    checks = pytester.mkdir("checks")
    (checks / "test_host.py").write_text(HOST_SUITE)
    (checks / "test_broken_module.py").write_text(OTHER.replace("test_elsewhere", "test_third_promise"))
    # marked, not listed: --clause finds it by its marker, read from the source under testpaths
    (checks / "test_more.py").write_text('import pytest\n\n@pytest.mark.clause("HOST-1")\n'
                                         'def test_first_promise_again():\n    pass\n')
    return pytester


@pytest.mark.clause("REPORT-10")
def test_a_hosts_own_specs_and_tests_are_reported_from_the_ini_option_and_spec_dir(pytester: pytest.Pytester) -> None:
    """REPORT-10: the plugin reads a host's specs directory from the ini option scheduler_specs
    (relative to the ini file, wherever the run starts) and its tests from its testpaths: the
    report holds exactly the host's clauses with their states, --clause runs one of them without
    importing the other modules, --spec-dir overrides the ini option, and a directory that is not
    there is a usage error naming both."""
    host = make_host(pytester)
    checks = host.path / "checks"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(checks)  # the run starts in a subdirectory: the ini option is the ini file's
        result = host.runpytest("--spec-report", str(host.path / "out"), str(checks / "test_host.py"))
    report = json.loads((host.path / "out" / "report.json").read_text())
    assert {c["id"]: c["state"] for c in report["clauses"]} == {"HOST-1": "proved", "HOST-2": "broken",
                                                                 "HOST-3": "not_run"}
    assert [c["kind"] for c in report["clauses"]] == ["own"] * 3 and report["problems"] == []
    assert result.outlines[-1].startswith("3 clauses: 1 proved, 1 broken (HOST-2), 1 not run — spec report ")
    selected = host.runpytest("--clause", "HOST-1")
    selected.assert_outcomes(passed=2, deselected=1)  # test_broken_module.py was never imported
    (host.path / "elsewhere").mkdir()
    (host.path / "elsewhere" / "other.md").write_text("# Other\n### OTHER-1 — Another page.\nProved by:\n"
                                                      "- checks/test_host.py::test_first_promise\n")
    other = host.runpytest("--spec-dir", "elsewhere", "--spec-report", "out2", "checks/test_host.py")
    assert other.outlines[-1].startswith("1 clauses: 1 proved — spec report out2/index.html")
    host.makeini(HOST_INI.replace("docs/promises", "docs/missing"))
    missing = host.runpytest("--clause", "HOST-1")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    assert "docs/missing is not a directory of spec pages (give it with --spec-dir, or the ini option " \
           "scheduler_specs)" in missing.stderr.str()


@pytest.mark.clause("REPORT-11")
def test_without_its_options_the_plugin_writes_nothing_and_imports_nothing_of_the_scheduler(
    pytester: pytest.Pytester,
) -> None:
    """REPORT-11: in a run without --spec-report and --clause the plugin (loaded from the wheel's
    entry point in every run) writes no report, prints no summary line, leaves the clause marker
    usable and imports no module of the scheduler; -p no:scheduler_spec_report unloads it."""
    make_host(pytester)
    (pytester.path / "checks" / "test_broken_module.py").unlink()
    (pytester.path / "checks" / "conftest.py").write_text(
        "import sys\n\n"
        "def pytest_sessionfinish(session):\n"
        "    loaded = sorted(m for m in sys.modules if m == 'scheduler' or m.startswith(('scheduler.', 'harness.')))\n"
        "    print('\\nLOADED', loaded)\n")
    result = pytester.runpytest_subprocess("-s", "-W", "error::pytest.PytestUnknownMarkWarning")
    result.assert_outcomes(passed=2, failed=1)
    loaded = next(line for line in result.outlines if line.startswith("LOADED"))
    assert "'harness.spec_report.plugin'" in loaded
    assert "'scheduler'" not in loaded and "'scheduler." not in loaded, loaded
    assert not any("clauses:" in line for line in result.outlines)
    assert [p for p in pytester.path.rglob("*") if p.name in ("report.json", "index.html")] == []
    unloaded = pytester.runpytest_subprocess("-p", "no:scheduler_spec_report", "--spec-report", "out")
    assert unloaded.ret == pytest.ExitCode.USAGE_ERROR
    assert "unrecognized arguments: --spec-report" in unloaded.stderr.str()


@pytest.mark.clause("REPORT-12")
def test_scripts_test_runs_the_suite_when_its_report_folder_already_exists_outside_the_checkout(tmp_path: Path) -> None:
    """REPORT-12: ``bash scripts/test`` hands pytest the report folder as one argument
    (``--spec-report=DIR``). As two, pytest takes a folder that exists for a path to test while
    it looks for the rootdir and the ini file (before any plugin has said what the option
    takes): a ``SCHEDULER_SPEC_REPORT`` outside the checkout became the rootdir, and the run
    stopped at once, finding no specs there."""
    root = Path(__file__).resolve().parents[2]
    folder = tmp_path / "spec-report"
    folder.mkdir()
    done = subprocess.run(["bash", "scripts/test", "--collect-only", "-q"], cwd=root, capture_output=True,
                          text=True, timeout=240, check=False,
                          env={**os.environ, "SCHEDULER_SPEC_REPORT": str(folder)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"^\d{3,} tests collected", done.stdout, re.M), done.stdout[-2000:]
    assert (folder / "report.json").exists()
