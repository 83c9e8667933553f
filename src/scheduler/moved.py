"""Public module paths that moved, and the one way an old path keeps working.

The layout that put the package in layers (core, nudging, database, web...) moved modules a
host imports or a rule file names. Each old path stays importable, as the very module at
its new path, with a ``DeprecationWarning`` naming that path (the README's "Public API";
CHANGELOG.md records each move); where a package now stands at the old path (the web edge's
``http``, ``console`` and ``inbox``), the names the old module offered are the package's
attributes, with the same warning (``forward``). ``resolve`` does the same for the ``module:function``
evaluator paths of rule files, and logs the warning too, since ``scheduler serve`` does
not show DeprecationWarnings.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)
_LOGGED: set[str] = set()

MOVED: dict[str, str] = {
    "scheduler.evaluators": "scheduler.nudging.evaluators",
    "scheduler.rules": "scheduler.nudging.rules",
    "scheduler.dispatch": "scheduler.nudging.dispatch",
    "scheduler.publishers": "scheduler.nudging.publishers",
    "scheduler.clock": "scheduler.core.clock",
    "scheduler.app": "scheduler.web.app",
    "scheduler.db": "scheduler.database.engine",
    # The web edge split by product: the shared HTTP kit, the JSON API, the console, the inbox.
    "scheduler.web.http": "scheduler.web.http.plumbing",
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
    "scheduler.web.console": "scheduler.web.console.pages",
    "scheduler.web.console_auth": "scheduler.web.console.auth",
    "scheduler.web.console_bulk": "scheduler.web.console.bulk",
    "scheduler.web.console_cancel": "scheduler.web.console.cancel",
    "scheduler.web.inbox": "scheduler.web.inbox.hub",
    "scheduler.web.inbox_routes": "scheduler.web.inbox.routes",
    "scheduler.web.inbox_session": "scheduler.web.inbox.session",
}


def alias(old: str) -> ModuleType:
    """Make ``old`` (a shim module importing itself) the module at its new path, warning once."""
    new = MOVED[old]
    warnings.warn(f"{old} is deprecated: import {new} instead", DeprecationWarning, stacklevel=3)
    module = importlib.import_module(new)
    sys.modules[old] = module
    return module


def forward(package: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` of a package that took the place of the module that moved
    into it (``scheduler.web.console`` was the console's module, and is now its package): a
    name the old module offered is the new module's, with a ``DeprecationWarning`` naming
    it. The package's own submodules are left to the import system, so importing one never
    imports the old module's new home (the console's pages stay unloaded until asked for)."""
    new = MOVED[package]

    def __getattr__(name: str) -> Any:
        if name.startswith("__") or importlib.util.find_spec(f"{package}.{name}") is not None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(new), name)  # an AttributeError names the new module
        warnings.warn(f"{package}.{name} is deprecated: import {new} instead", DeprecationWarning,
                      stacklevel=2)
        return value

    return __getattr__


def resolve(path: str) -> str:
    """A rule file's evaluator path (``module:function``) at its current module, warning
    (and logging) when it names a module that moved."""
    module, sep, attr = path.partition(":")
    new = MOVED.get(module)
    if new is None:
        return path
    current = f"{new}{sep}{attr}"
    message = f"evaluator path {path!r} is deprecated: use {current!r}"
    warnings.warn(message, DeprecationWarning, stacklevel=2)
    if path not in _LOGGED:  # once per path: a rule's evaluator is resolved at every dispatch
        _LOGGED.add(path)
        logger.warning("%s (the old path still works for now)", message)
    return current


__all__ = ["MOVED", "alias", "forward", "resolve"]
