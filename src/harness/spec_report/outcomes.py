"""What one run of one test (one parametrized variant) came to, from pytest's reports.

A variant's three phases (setup, call, teardown) fold into one outcome: a failure in any
phase fails it (an error in a fixture is a failure of the clause too), a skip in setup or
call skips it with its reason, an expected failure is ``xfailed`` (or ``xpassed``), and the
duration is the three phases' sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import pytest

FAILURE_LINES = 12
FAILURE_CHARS = 2000


class Outcome(StrEnum):
    """A test's outcome in the report, from worst to best (``not_run``: not in this run)."""

    FAILED = "failed"
    SKIPPED = "skipped"
    XFAILED = "xfailed"
    XPASSED = "xpassed"
    NOT_RUN = "not_run"
    PASSED = "passed"


@dataclass
class Run:
    """One variant of a test (``nodeid`` with its ``[parameters]``) in this run."""

    nodeid: str
    outcome: Outcome = Outcome.PASSED
    duration: float = 0.0
    reason: str | None = None
    failure_phase: str | None = None
    failure_location: str | None = None
    failure_lines: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        failure = None
        if self.outcome is Outcome.FAILED:
            failure = {"phase": self.failure_phase, "location": self.failure_location,
                       "lines": self.failure_lines}
        return {"nodeid": self.nodeid, "outcome": self.outcome.value,
                "duration_seconds": round(self.duration, 4), "reason": self.reason,
                "failure": failure}


def base_nodeid(nodeid: str) -> str:
    """The node id a spec page lists: the variant's id without its ``[parameters]``."""
    return nodeid.split("[", 1)[0]


def _first_lines(report: pytest.TestReport, root: Path | None) -> tuple[str | None, list[str]]:
    longrepr = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        path = Path(crash.path)
        if root is not None and path.is_relative_to(root):
            path = path.relative_to(root)
        location = f"{path.as_posix()}:{crash.lineno}"
        text = str(crash.message)
    else:
        location = None
        text = report.longreprtext
    text = text[:FAILURE_CHARS]
    return location, [line.rstrip() for line in text.splitlines()[:FAILURE_LINES]]


def _skip_reason(report: pytest.TestReport) -> str:
    if isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        return reason.removeprefix("Skipped: ")
    return report.longreprtext


def fold(run: Run, report: pytest.TestReport, root: Path | None = None) -> None:
    """Fold one phase's report into its variant's run (a failure's file relative to ``root``)."""
    run.duration += report.duration
    if run.outcome is Outcome.FAILED:
        return
    wasxfail = getattr(report, "wasxfail", None)
    if report.failed:
        run.outcome = Outcome.FAILED
        run.failure_phase = report.when
        run.failure_location, run.failure_lines = _first_lines(report, root)
    elif report.skipped and wasxfail is not None:
        run.outcome, run.reason = Outcome.XFAILED, str(wasxfail) or None
    elif report.skipped:
        run.outcome, run.reason = Outcome.SKIPPED, _skip_reason(report)
    elif report.when == "call" and wasxfail is not None:
        run.outcome, run.reason = Outcome.XPASSED, str(wasxfail) or None


def not_collected(nodeid: str, error: str) -> Run:
    """The run of a test whose module failed to be collected (an import error, say)."""
    lines = [line.rstrip() for line in error[-FAILURE_CHARS:].splitlines()]
    return Run(nodeid, Outcome.FAILED, failure_phase="collect", failure_lines=lines[-FAILURE_LINES:])


def overall(runs: list[Run]) -> Outcome:
    """A test's outcome over its variants: the worst of them (``not_run`` when none ran)."""
    if not runs:
        return Outcome.NOT_RUN
    return min((run.outcome for run in runs), key=list(Outcome).index)
