"""The replica simulation harness: several production schedulers, one PostgreSQL, one frozen clock.

``Simulation`` runs explicit steps (posts, claims, dispatches, commits, crashes, kills,
freezes, clock jumps and skews) across replicas and compares the database with an in-memory
model after each one; ``driver.run_random`` drives it from a seed; ``broken.VARIANTS`` are schedulers with one
deliberate bug each, which the invariants must catch. See docs/simulation.md.

One concept per module:

- ``simulation``: a run, its step API (what the drivers call) and its bookkeeping;
- ``assembly``: what a run is made of (its replicas, clients and the database before the
  first step);
- ``choices``: which replicas and clients are free for which step (what both drivers ask);
- ``expectations``: a host's expectation of its events, and the check of each outcome against it;
- ``types``: ``RunContext``, what the steps see of a run (``Simulation`` is one), and ``Violation``;
- ``posts``: the API side (posts in one or two steps, resets by hand, cancels);
- ``phases``: a replica's claim, dispatch, finish and stop, one phase per step;
- ``run_steps``: a replica running the production loop (literal or prompt mode);
- ``replica_faults``: a poll armed to fail, a crash, a killed backend, a replica frozen
  mid-batch past the idle-in-transaction timeout;
- ``clocks``: each replica's host clock (skewed by a step) and the clock its scheduler reads;
- ``settle``: waiting until every actor has finished or waits on a lock;
- ``oracle``: the whole-database invariants, checked after every step;
- ``probe``: what a host's dispatch rolled back on purpose left committed outside the
  scheduler's transaction (a table outside its schema, the outbox, a pushed message);
- ``teardown``: ending a run in any state, and what it suppresses;
- ``host``: a host's own dispatcher in a run (``HostDispatcher``: its factory, table setup,
  expectation of an event and effects check) and how ``package.module:name`` paths load;
- ``shrink``: the fewest steps of a failing program that still break the same invariant;
- ``report``: ``--json``'s one document, ``--junit-xml`` and the exit codes;
- ``spec_report``: the spec report and the selection by clause, a pytest plugin of its own
  (``pytest11``) for this checkout's specs/ and a host's own;
- ``pytest_plugin``: the fixtures a host's test suite gets from the wheel (``pytest11``);
  ``sim_runner``, what those fixtures do (a server, a migrated template database and a clone
  of it per test, seeded runs that shrink and write a regression test on a violation);
- ``local_model``, ``local_run``, ``local_cli``: the local-time scenario (``--scenario
  local-time``): participants in seeded zones and quiet hours and a start before a DST
  change, with its model and broken variants; a run of it, its steps and the SIM-LOCAL
  invariants; and its command;
- ``model``, ``observer``, ``actors``, ``faults``, ``broken``, ``driver``, ``cli``: the model
  of REQ-0063 to REQ-0067, the observer's connection, the actor threads, event faults, the
  broken variants (their SQL rewrites, built when a run asks for the variant, and the guard
  that fails when the SQL they target changes), the random driver, and ``scheduler simulate``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.broken import VARIANTS, Variant
    from harness.host import Expected, HostDispatcher, HostImportError, Outcome, load_host
    from harness.settle import HarnessError
    from harness.simulation import T0, Simulation
    from harness.types import Violation

# Loaded on first use (PEP 562): ``harness.pytest_plugin``, which pytest imports in every
# session of a project with the wheel installed, must not import the simulation with it.
_EXPORTS = {
    "VARIANTS": "harness.broken", "Variant": "harness.broken",
    "Expected": "harness.host", "HostDispatcher": "harness.host", "HostImportError": "harness.host",
    "Outcome": "harness.host", "load_host": "harness.host",
    "HarnessError": "harness.settle", "T0": "harness.simulation", "Simulation": "harness.simulation",
    "Violation": "harness.types",
}

__all__ = ["T0", "VARIANTS", "Expected", "HarnessError", "HostDispatcher", "HostImportError", "Outcome",
           "Simulation", "Variant", "Violation", "load_host"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
