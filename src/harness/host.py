"""A host's own dispatcher in the simulation: the spec a host hands over, and how paths load.

The built-in platform (``NudgingPlatform``) is what a run dispatches through unless it is
given a ``HostDispatcher``. With one, every replica gets its own dispatcher from the host's
``factory``; the invariants that hold for any dispatcher are checked as for the built-in one
(SIM-1 to SIM-5, SIM-7, SIM-10, SIM-11, SIM-CANCEL), and those of the built-in platform's
decisions (SIM-6: deduplication, the daily cap, preferences) are not. The host's own hooks
add what only it knows: what it expects of an event (``expect``) and whether its own writes
agree with what committed (``check_effects``, SIM-12). See docs/simulation.md, "A host's
dispatcher".

Nothing here imports the scheduler's database code at import time beyond its types, so
``harness.pytest_plugin`` can import it lazily and stay light.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from sqlalchemy import Connection

from scheduler.types import DigitalTwinEvent, Dispatcher

# The event faults the random driver chooses from, per dispatcher. ``refused`` is an unusable
# time scope that the built-in platform refuses when it fires; a host's dispatcher is not
# bound to refuse it, so a host's run never posts it and ``slow`` takes its place. Each
# tuple has three entries, so the built-in run's random choices are exactly today's.
BUILTIN_FAULTS = ("python", "database", "refused")
HOST_FAULTS = ("python", "database", "slow")
EVENT_FAULTS = ("python", "database", "refused", "slow")
# What each fault does to any dispatcher: the status the event must end in.
FAULT_STATUS = {"python": "failed", "database": "failed", "refused": "failed", "slow": "dispatched"}


class HostImportError(ValueError):
    """A ``package.module:attribute`` path that does not name something usable."""


@dataclass(frozen=True)
class Expected:
    """What the host expects of one event: ``dispatched``, or ``failed`` with ``reason``
    somewhere in the row's ``last_error``."""

    status: Literal["dispatched", "failed"] = "dispatched"
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.status not in ("dispatched", "failed"):
            raise ValueError(f"an event ends dispatched or failed, not {self.status!r}")
        if self.reason is not None and self.status != "failed":
            raise ValueError("only a failed event has a reason")


@dataclass(frozen=True)
class Outcome:
    """One committed outcome of the run, as the model knows it (what ``check_effects`` gets).

    A row dispatched, re-posted and dispatched again has two outcomes; ``version`` is the
    post (``facts["sim_version"]``) that was dispatched."""

    event_id: str
    version: int
    status: str  # "dispatched" or "failed"


# (the observer's autocommit connection, every committed outcome so far) -> a problem or None
EffectsCheck = Callable[[Connection, Sequence[Outcome]], "str | None"]
ExpectHook = Callable[[DigitalTwinEvent], "Expected | None"]
SetupHook = Callable[[Connection], None]


@dataclass(frozen=True)
class HostDispatcher:
    """A host's dispatcher as the simulation runs it.

    - ``factory()`` returns a ``scheduler.types.Dispatcher``; it is called once per replica
      (and again for nothing else: a crashed replica keeps its dispatcher).
    - ``setup(connection)`` creates the host's own tables in the run's database, or empties
      them: it runs before every run, the shrinker's replays included, inside a transaction
      it must not commit.
    - ``expect(event)`` says what the host expects of an event that carries no injected
      fault (``None``: dispatched). The event is exactly what the dispatcher will be given.
    - ``check_effects(connection, outcomes)`` reads the host's own tables (the connection
      sees only committed state) and returns a sentence when they disagree with the
      committed outcomes, e.g. "2 host_deliveries rows for event X, dispatched once"
      (raising ``AssertionError`` works too). It runs after every step when
      ``check_every_step`` (the default), and always after the final drain.
    - ``path`` (set by ``load_host``) is how a regression test and a replay command name it.
    """

    factory: Callable[[], Dispatcher]
    setup: SetupHook | None = None
    expect: ExpectHook | None = None
    check_effects: EffectsCheck | None = None
    check_every_step: bool = True
    name: str = "host"
    path: str | None = None
    setup_path: str | None = None


def _resolve(path: str, what: str) -> Any:
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise HostImportError(f"{what} {path!r} is not of the form package.module:name")
    # As `python -m` does: the current directory first, so a host's own package imports.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise HostImportError(f"{what} {path!r}: module {module_name!r} does not import ({exc})") from exc
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise HostImportError(f"{what} {path!r}: module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target


def load_host(dispatcher: str, setup: str | None = None) -> HostDispatcher:
    """The host named by ``--dispatcher package.module:name`` (a ``HostDispatcher``, or a
    factory of dispatchers) and ``--setup package.module:function`` (which replaces the
    spec's own ``setup``). Raises ``HostImportError`` with a sentence when a path is unusable."""
    found = _resolve(dispatcher, "--dispatcher")
    if isinstance(found, HostDispatcher):
        host = replace(found, path=dispatcher)
    elif callable(found):
        host = HostDispatcher(factory=found, name=dispatcher.rpartition(":")[2], path=dispatcher)
    else:
        raise HostImportError(f"--dispatcher {dispatcher!r} is neither a HostDispatcher nor a callable "
                              "that returns a dispatcher")
    if setup is not None:
        function = _resolve(setup, "--setup")
        if not callable(function):
            raise HostImportError(f"--setup {setup!r} is not a function of a connection")
        host = replace(host, setup=function, setup_path=setup)
    return host


def host_of(dispatcher_factory: Callable[[], Dispatcher] | None, host: HostDispatcher | None) -> HostDispatcher | None:
    """``Simulation``'s two ways to name a host: a bare factory, or a whole spec."""
    if dispatcher_factory is not None and host is not None:
        raise ValueError("give a Simulation either dispatcher_factory or host, not both")
    if dispatcher_factory is not None:
        name = getattr(dispatcher_factory, "__qualname__", "host")
        module = getattr(dispatcher_factory, "__module__", None)
        path = f"{module}:{name}" if module and "<" not in name else None
        return HostDispatcher(factory=dispatcher_factory, name=name, path=path)
    return host


def source_of(host: HostDispatcher | None) -> str:
    """The Python expression that rebuilds ``host`` in a regression test (``None``: built-in)."""
    if host is None:
        return "None"
    path = host.path or _where_defined(host)
    if path is None:
        raise ValueError(f"the host dispatcher {host.name!r} is not a module attribute; a regression test "
                         "cannot name it (give it path='package.module:NAME', or load it with harness.load_host)")
    setup = f", {host.setup_path!r}" if host.setup_path else ""
    return f"load_host({path!r}{setup})"


def _where_defined(host: HostDispatcher) -> str | None:
    """``package.module:NAME`` of a module attribute that is ``host`` itself, if one is."""
    for module_name, module in list(sys.modules.items()):
        if module is None or module_name == "__main__":
            continue
        for name, value in list(vars(module).items()):
            if value is host:
                return f"{module_name}:{name}"
    return None
