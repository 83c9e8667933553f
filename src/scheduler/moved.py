"""Public module paths that moved, and the one way an old path keeps working.

The layout that put the package in layers (core, nudging, database, web...) moved modules a
host imports or a rule file names. Each old path stays importable, as the very module at
its new path, with a ``DeprecationWarning`` naming that path (the README's "Public API";
CHANGELOG.md records each move). ``resolve`` does the same for the ``module:function``
evaluator paths of rule files, and logs the warning too, since ``scheduler serve`` does
not show DeprecationWarnings.
"""

from __future__ import annotations

import importlib
import logging
import sys
import warnings
from types import ModuleType

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
}


def alias(old: str) -> ModuleType:
    """Make ``old`` (a shim module importing itself) the module at its new path, warning once."""
    new = MOVED[old]
    warnings.warn(f"{old} is deprecated: import {new} instead", DeprecationWarning, stacklevel=3)
    module = importlib.import_module(new)
    sys.modules[old] = module
    return module


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


__all__ = ["MOVED", "alias", "resolve"]
