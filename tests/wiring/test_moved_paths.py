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

from scheduler import moved
from scheduler.nudging import evaluators
from scheduler.nudging.rules import DEFAULT_CATALOGUE, load_catalogue
from scheduler.web.app import SchedulerService

# What moved (git log --diff-filter=R) that a host imports or a rule file names.
MOVED = {
    "scheduler.evaluators": "scheduler.nudging.evaluators",
    "scheduler.rules": "scheduler.nudging.rules",
    "scheduler.dispatch": "scheduler.nudging.dispatch",
    "scheduler.publishers": "scheduler.nudging.publishers",
    "scheduler.clock": "scheduler.core.clock",
    "scheduler.app": "scheduler.web.app",
    "scheduler.db": "scheduler.database.engine",
    "scheduler.web.errors": "scheduler.web.http.errors",
    "scheduler.web.params": "scheduler.web.http.params",
    "scheduler.web.auth": "scheduler.web.http.auth",
    "scheduler.web.sessions": "scheduler.web.http.sessions",
    "scheduler.web.sse": "scheduler.web.http.sse",
    "scheduler.web.schemas": "scheduler.web.http.schemas",
    "scheduler.web.openapi": "scheduler.web.api.openapi",
    "scheduler.web.ingest": "scheduler.web.api.ingest",
    "scheduler.web.batch": "scheduler.web.api.batch",
    "scheduler.web.scheduled_events": "scheduler.web.api.scheduled_events",
    "scheduler.web.participants": "scheduler.web.api.participants",
    "scheduler.web.health": "scheduler.web.api.health",
    "scheduler.web.admin": "scheduler.web.api.operator",
    "scheduler.web.console_auth": "scheduler.web.console.auth",
    "scheduler.web.console_bulk": "scheduler.web.console.bulk",
    "scheduler.web.console_cancel": "scheduler.web.console.cancel",
    "scheduler.web.inbox_routes": "scheduler.web.inbox.routes",
    "scheduler.web.inbox_session": "scheduler.web.inbox.session",
}
# Moved modules whose old path is now a package of the new layout (its product's, or the HTTP
# kit's): the old module's names are the package's attributes; one name each module offered.
BECAME_PACKAGES = {
    "scheduler.web.http": ("scheduler.web.http.plumbing", "respond"),
    "scheduler.web.console": ("scheduler.web.console.pages", "Console"),
    "scheduler.web.inbox": ("scheduler.web.inbox.hub", "Inbox"),
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
    parent, _, name = old.rpartition(".")
    monkeypatch.delitem(sys.modules, old, raising=False)
    monkeypatch.delattr(importlib.import_module(parent), name, raising=False)
    with pytest.warns(DeprecationWarning, match=f"import {MOVED[old]} instead"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])


@pytest.mark.clause("ARCH-3")
@pytest.mark.parametrize("old", sorted(BECAME_PACKAGES))
def test_a_moved_module_whose_path_is_now_a_package_offers_its_names_there_with_a_warning(old: str) -> None:
    """ARCH-3: ``from scheduler.web.console import Console`` (the console's module before the
    web edge was split by product, now the package ``scheduler.web.console``) gives the very
    object of the new module, warning with the new module's name; the table is
    ``scheduler.moved.MOVED``, and a name neither offered is an AttributeError."""
    new, name = BECAME_PACKAGES[old]
    assert moved.MOVED[old] == new
    package = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=f"{old}.{name} is deprecated: import {new} instead"):
        value = getattr(package, name)
    assert value is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError):
        package.no_such_name  # noqa: B018 - the lookup is the test


@pytest.mark.clause("ARCH-3")
def test_the_moved_table_of_the_tests_is_the_one_of_scheduler_moved() -> None:
    """ARCH-3: every move this file checks is in ``scheduler.moved.MOVED`` and every entry
    there is checked here, as a module (an alias) or as a package's names (``forward``)."""
    assert {**MOVED, **{old: new for old, (new, _) in BECAME_PACKAGES.items()}} == moved.MOVED


@pytest.mark.clause("ARCH-3")
def test_the_services_old_operations_attribute_gives_the_parts_it_held_with_a_warning(
    service: SchedulerService,
) -> None:
    """ARCH-3: ``service.operations`` (the parts the composition root now builds itself) still
    gives the very heartbeat, metrics and browser-session store the service uses, and the
    operator routes with or without the console's, warning with the new names."""
    with pytest.warns(DeprecationWarning, match="use service.heartbeat, service.metrics"):
        operations = service.operations
    assert operations.heartbeat is service.heartbeat and operations.metrics is service.metrics
    assert operations.session_store is service.web_sessions
    without = [getattr(r, "path", None) for r in operations.routes(console=False)]
    assert without == [getattr(r, "path", None) for r in service.operator.routes()]
    with_console = [getattr(r, "path", None) for r in operations.routes()]
    assert with_console[:len(without)] == without and len(with_console) > len(without)
    assert all(str(path).startswith("/console") for path in with_console[len(without):])
