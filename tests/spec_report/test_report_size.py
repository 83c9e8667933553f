"""The report of a full run, built from the real specs/ without running the suite: every test
each clause lists, in three variants each, with a failure and a skip among them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import harness.spec_report
from harness.spec_report.outcomes import Outcome, Run
from harness.spec_report.render import render
from harness.spec_report.report import build_report
from harness.spec_report.specs import markers_in_source, parse_specs
from tests.spec_report.schema_check import validate

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = Path(harness.spec_report.__file__).with_name("report.schema.json")
# Generous for a shared two-core machine: it takes about a tenth of a second.
BUDGET_SECONDS = 3.0


@pytest.mark.clause("REPORT-8")
def test_the_report_of_every_clause_is_built_in_well_under_the_budget_and_stays_small() -> None:
    """REPORT-8: the report of a run of the whole suite (every clause of specs/, every listed
    test in three variants) is built and rendered in under three seconds, the page is under
    2 MB, and its JSON validates against the schema."""
    specs = parse_specs(ROOT / "specs")
    tests = sorted({node for clause in specs.clauses.values() for node in clause.tests})
    runs = {node: [Run(f"{node}[{n}]", duration=0.05) for n in range(3)] for node in tests}
    runs[tests[0]][1].outcome, runs[tests[0]][1].failure_phase = Outcome.FAILED, "call"
    runs[tests[0]][1].failure_lines = ["AssertionError: planted"] * 20
    runs[tests[1]][0].outcome, runs[tests[1]][0].reason = Outcome.SKIPPED, "chromium is not installed"
    marked = {node: cids for node, cids in markers_in_source(ROOT).items() if cids}
    started = time.perf_counter()
    report = build_report(specs, runs, marked, {"args": [], "clause_selection": [], "exit_status": 1,
                                                "tests_run": 3 * len(tests), "duration_seconds": 1.0})
    page = render(report)
    elapsed = time.perf_counter() - started
    assert elapsed < BUDGET_SECONDS, f"{elapsed:.2f} s"
    assert len(page.encode()) < 2_000_000
    assert report["summary"]["clauses"] == len(specs.clauses)
    assert report["summary"]["broken"] >= 1 and report["summary"]["unproven"] >= 1
    summary = report["summary"]
    assert summary["proved"] + summary["broken"] + summary["unproven"] == len(specs.clauses)
    assert validate(report, json.loads(SCHEMA.read_text())) == []
