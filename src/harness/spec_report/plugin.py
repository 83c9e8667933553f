"""The spec report as a pytest plugin, shipped in the wheel: the ``pytest11`` entry point
``scheduler_spec_report``, so it is there in any pytest run of a project with
``nudging-scheduler`` installed (this checkout's suite included), for the checkout's clauses
and for a host's own. It does nothing unless a run asks (``--spec-report`` or ``--clause``)
and imports nothing of the scheduler; ``-p no:scheduler_spec_report`` disables it.

``--spec-report DIR`` writes ``DIR/report.json`` and ``DIR/index.html`` after the run:
every clause of the specs directory, the tests that prove it and what they came to, and prints
the one-line summary as the last line of the output. ``--clause ID`` (repeatable; a prefix such
as ``REQ-0065`` selects every clause under it) runs only the tests that prove the selected
clauses; a value that selects no clause is a usage error naming it. The specs directory is
``--spec-dir DIR``, else the ini option ``scheduler_specs`` (relative to the ini file), else
``<rootdir>/specs``.

A clause's tests are those its page lists and those whose ``clause`` marker names it; in this
checkout the map test (tests/test_spec_map.py) keeps the two the same.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness.spec_report.outcomes import Run, base_nodeid, fold, not_collected
from harness.spec_report.render import render
from harness.spec_report.report import build_report
from harness.spec_report.specs import Specs, markers_in_source, parse_specs

PLUGIN_NAME = "spec-report"
INI_SPECS = "scheduler_specs"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("spec report", "the specification report: specs/ clause by clause")
    group.addoption("--spec-report", metavar="DIR", default=None,
                    help="after the run, write DIR/index.html and DIR/report.json: every clause of "
                         "specs/ with the tests that prove it and their outcomes (proved, broken, "
                         "unproven, not run), and print the one-line summary at the end")
    group.addoption("--clause", metavar="ID", action="append", default=[],
                    help="run only the tests that prove clause ID (repeatable; a prefix selects every "
                         "clause under it: REQ-0065 for the whole requirement, DEC for every decision)")
    group.addoption("--spec-dir", metavar="DIR", default=None,
                    help=f"the specs directory the report and --clause read (default: the ini option "
                         f"{INI_SPECS}, else <rootdir>/specs)")
    parser.addini(INI_SPECS, "the directory of spec pages (### ID — statement, Proved by: ...) that "
                             "--spec-report and --clause read, relative to the ini file (default: specs)")


def spec_dir_of(config: pytest.Config) -> Path:
    """The specs directory of this run: ``--spec-dir``, else the ini option (relative to the ini
    file), else ``<rootdir>/specs``."""
    given: str | None = config.getoption("spec_dir")
    if given:
        return Path(config.invocation_params.dir, given)
    configured = str(config.getini(INI_SPECS) or "")
    if configured:
        return Path(config.inipath.parent if config.inipath else config.rootpath, configured)
    return config.rootpath / "specs"


def source_modules(config: pytest.Config) -> list[Path]:
    """The test modules a clause marker may stand in, read from source for ``--clause``: those
    under ``testpaths`` (else ``tests/``, else the rootdir) named as ``python_files`` says, in
    directories ``norecursedirs`` does not skip."""
    root = config.rootpath
    entries = [str(entry) for entry in config.getini("testpaths")]
    if entries:
        starts = [Path(found) for entry in entries for found in sorted(glob.glob(str(root / entry)))]
    else:
        starts = [root / "tests" if (root / "tests").is_dir() else root]
    patterns = [str(pattern) for pattern in config.getini("python_files")]
    skip = [str(pattern) for pattern in config.getini("norecursedirs")]
    found: dict[Path, None] = {}
    for start in starts:
        if start.is_file():
            found.setdefault(start, None)
            continue
        for directory, subdirectories, names in os.walk(start):
            subdirectories[:] = sorted(d for d in subdirectories if not any(fnmatch.fnmatch(d, p) for p in skip))
            for name in sorted(names):
                if any(fnmatch.fnmatch(name, pattern) for pattern in patterns):
                    found.setdefault(Path(directory, name), None)
    return list(found)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "clause(id): the requirement clause a test proves (see specs/)")
    report_dir: str | None = config.getoption("spec_report")
    selectors: list[str] = config.getoption("clause")
    if report_dir is None and not selectors:
        return
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its controller writes the report
        return
    spec_dir = spec_dir_of(config)
    if not spec_dir.is_dir():
        raise pytest.UsageError(f"--spec-report/--clause: {spec_dir} is not a directory of spec pages "
                                f"(give it with --spec-dir, or the ini option {INI_SPECS})")
    specs = parse_specs(spec_dir)
    unknown = [selector for selector in selectors if not specs.matching(selector)]
    if unknown:
        raise pytest.UsageError(
            f"--clause {', '.join(unknown)}: no clause of {spec_dir} has this ID or starts with it "
            "(IDs look like REQ-0065.2; REQ-0065 selects the whole requirement)")
    out = Path(config.invocation_params.dir, report_dir) if report_dir is not None else None
    shown = Path(report_dir, "index.html") if report_dir is not None else None
    config.pluginmanager.register(SpecReport(config, specs, selectors, out, shown), PLUGIN_NAME)


class SpecReport:
    """One run's selection by clause and its report."""

    def __init__(self, config: pytest.Config, specs: Specs, selectors: list[str], out: Path | None,
                 shown: Path | None = None) -> None:
        self.config = config
        self.shown = shown or out
        self.specs = specs
        self.out = out
        self.selected = {cid for selector in selectors for cid in specs.matching(selector)}
        self.selectors = selectors
        self.marked: dict[str, set[str]] = {}
        self.runs: dict[str, dict[str, Run]] = {}
        self.collect_errors: dict[str, str] = {}
        self.started = time.monotonic()
        self.line: str | None = None
        self.wanted: set[str] = set()
        self.wanted_files: set[str] | None = None
        if self.selected:
            wanted = {node for cid in self.selected for node in specs.clauses[cid].tests}
            marked = markers_in_source(config.rootpath, source_modules(config))
            wanted |= {node for node, cids in marked.items() if cids & self.selected}
            self.wanted_files = {node.split("::", 1)[0] for node in wanted}
            self.wanted = wanted

    def pytest_ignore_collect(self, collection_path: Path) -> bool | None:
        """With ``--clause``, a test module that holds none of the selected tests is not even
        imported (the marker check below still decides for the modules that are)."""
        if self.wanted_files is None or not collection_path.is_file():
            return None
        patterns = [str(pattern) for pattern in self.config.getini("python_files")]
        if not any(fnmatch.fnmatch(collection_path.name, pattern) for pattern in patterns):
            return None
        try:
            rel = collection_path.relative_to(self.config.rootpath).as_posix()
        except ValueError:
            return None
        return True if rel not in self.wanted_files else None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        for item in items:
            self.marked.setdefault(base_nodeid(item.nodeid), set()).update(
                str(mark.args[0]) for mark in item.iter_markers("clause") if mark.args)
        if not self.selected:
            return
        kept: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            base = base_nodeid(item.nodeid)
            proves = base in self.wanted or bool(self.marked.get(base, set()) & self.selected)
            (kept if proves else dropped).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A module that fails to import fails every test it holds: their clauses are broken,
        not merely not run."""
        if report.failed:
            self.collect_errors[report.nodeid] = report.longreprtext

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        variants = self.runs.setdefault(base_nodeid(report.nodeid), {})
        run = variants.setdefault(report.nodeid, Run(report.nodeid))
        fold(run, report, self.config.rootpath)

    def report(self, exitstatus: int) -> dict[str, Any]:
        """The report of the run so far."""
        runs = {base: list(variants.values()) for base, variants in self.runs.items()}
        if self.collect_errors:
            for cid, clause in self.specs.clauses.items():
                for node in [*clause.tests, *(n for n, cids in self.marked.items() if cid in cids)]:
                    error = self.collect_errors.get(node.split("::", 1)[0])
                    if error is not None and node not in runs:
                        runs[node] = [not_collected(node, error)]
        info = {"args": list(self.config.invocation_params.args), "clause_selection": self.selectors,
                "exit_status": int(exitstatus), "tests_run": sum(len(v) for v in runs.values()),
                "duration_seconds": round(time.monotonic() - self.started, 2)}
        return build_report(self.specs, runs, self.marked, info)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.out is None:
            return
        started = time.perf_counter()
        report = self.report(exitstatus)
        page = render(report)
        report["run"]["report_seconds"] = round(time.perf_counter() - started, 3)
        self.out.mkdir(parents=True, exist_ok=True)
        write(self.out / "report.json", json.dumps(report, indent=1, ensure_ascii=False) + "\n")
        write(self.out / "index.html", page)
        self.line = (f"{report['summary']['line']} — spec report {self.shown} "
                     f"({report['run']['report_seconds']:.2f} s)")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """The summary line, after pytest's own last line: CI's output ends with it."""
        if self.line is None:
            return
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(self.line, bold=True)
        else:
            print(self.line, file=sys.stdout)


def write(path: Path, text: str) -> None:
    """Replace ``path`` whole: a reader never sees half a report."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    partial.replace(path)
