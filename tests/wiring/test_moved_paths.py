"""ARCH-3: public paths that moved keep working, with a DeprecationWarning naming the new one.

The layout in layers moved the evaluators a rule file names and the modules a host imports;
a deployment's rule files and imports must not break on upgrade.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from pathlib import Path

import pytest

import scheduler
from scheduler import moved
from scheduler.nudging import evaluators
from scheduler.nudging.rules import DEFAULT_CATALOGUE, load_catalogue

# What moved (git log --diff-filter=R) that a host imports or a rule file names.
MOVED = {
    "scheduler.evaluators": "scheduler.nudging.evaluators",
    "scheduler.rules": "scheduler.nudging.rules",
    "scheduler.dispatch": "scheduler.nudging.dispatch",
    "scheduler.publishers": "scheduler.nudging.publishers",
    "scheduler.clock": "scheduler.core.clock",
    "scheduler.app": "scheduler.web.app",
    "scheduler.db": "scheduler.database.engine",
}


@pytest.mark.clause("ARCH-3")
def test_a_rule_file_naming_the_evaluators_old_path_loads_and_warns_naming_the_new_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ARCH-3: ``scheduler.evaluators:below_target`` (the shipped catalogue's path before the
    layout) still loads, as the same function, with a DeprecationWarning and a log line."""
    monkeypatch.setattr(moved, "_LOGGED", set())  # logged once per process: this test's own
    for shipped in DEFAULT_CATALOGUE.glob("*.json"):
        text = shipped.read_text().replace("scheduler.nudging.evaluators:", "scheduler.evaluators:")
        (tmp_path / shipped.name).write_text(text)
    assert "scheduler.evaluators:below_target" in "".join(p.read_text() for p in tmp_path.glob("*.json"))
    with caplog.at_level(logging.WARNING), \
            pytest.warns(DeprecationWarning, match="use 'scheduler.nudging.evaluators:below_target'"):
        catalogue = load_catalogue(tmp_path)
        found = [rule.evaluator() for rule in catalogue.rules
                 if rule.evaluator_path == "scheduler.evaluators:below_target"]
    assert found and all(f is evaluators.below_target for f in found)
    assert any("scheduler.nudging.evaluators:below_target" in r.getMessage() for r in caplog.records)
    assert json.loads(next(tmp_path.glob("*.json")).read_text())  # still a valid rule file


@pytest.mark.clause("ARCH-3")
@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_moved_public_module_imports_as_the_module_at_its_new_path_with_a_warning(
    old: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ARCH-3: ``import scheduler.evaluators`` (and each other moved module) gives the very
    module at the new path, warning with the new path's name."""
    monkeypatch.delitem(sys.modules, old, raising=False)
    monkeypatch.delattr(scheduler, old.rpartition(".")[2], raising=False)
    with pytest.warns(DeprecationWarning, match=f"import {MOVED[old]} instead"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
