"""The Hypothesis state machine over the simulation's steps, and its settings profiles.

Each rule is one ``Simulation`` step; the ``@invariant``s are the oracle's whole-database
checks, run after every step. A failure shrinks to a short program of ``state.<step>(...)``
calls, which reads like (and is copied into) a regression test.

Profiles are registered here and applied explicitly, never loaded globally, so other suites
keep their own Hypothesis settings. ``SIM_PROFILE=soak`` runs many more, longer programs.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from harness import Simulation

REPLICAS = 3
CLIENTS = 2
BATCH_SIZE = 3
PARTICIPANTS = 3

_COMMON: dict[str, Any] = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                              HealthCheck.filter_too_much],
    "print_blob": True,
}
# CI: a fixed derandomised search (the same programs every run) ...
settings.register_profile("simulation-ci", max_examples=150, stateful_step_count=40, derandomize=True, **_COMMON)
# ... plus a few programs from a fresh seed each run (printed first, replayable).
settings.register_profile("simulation-random", max_examples=20, stateful_step_count=40, **_COMMON)
# Locally: SIM_PROFILE=soak python -m pytest tests/simulation
settings.register_profile("simulation-soak", max_examples=400, stateful_step_count=60, **_COMMON)


def profile(name: str) -> settings:
    """The named profile, or the soak profile when ``SIM_PROFILE=soak``."""
    if os.environ.get("SIM_PROFILE") == "soak":
        return settings.get_profile("simulation-soak")
    return settings.get_profile(name)


replicas = st.integers(0, REPLICAS - 1)
clients = st.integers(0, CLIENTS - 1)
users = st.integers(0, PARTICIPANTS - 1)
triggers = st.integers(-20, 15)  # minutes from now: most events are due, some are not yet
keys = st.sampled_from([None, None, "k0", "k1", "k2"])
days = st.integers(0, 2)  # the facts' date: events of one participant and day share a dedup key
faults = st.sampled_from([None, None, None, None, "python", "database", "refused"])


class ReplicaMachine(RuleBasedStateMachine):
    """Three production replicas, two API clients, three participants, batches of three.

    The replicas run mixed modes (DEC-9): replica 1 is a prompt-mode loop, so a ``run`` of
    it polls again at once after each full batch; the others are literal."""

    database_url: ClassVar[str] = ""
    scheduler: ClassVar[str] = "correct"
    modes: ClassVar[str] = "mixed"

    def __init__(self) -> None:
        super().__init__()
        self.sim = Simulation(self.database_url, replicas=REPLICAS, clients=CLIENTS, batch_size=BATCH_SIZE,
                              participants=PARTICIPANTS, scheduler=self.scheduler, check_every_step=False,
                              modes=self.modes)

    # -- the API side --------------------------------------------------------------------

    @initialize(events=st.lists(st.tuples(users, st.integers(-20, -1), keys, days, faults), min_size=1, max_size=6))
    def some_events_are_due_already(self, events: list[tuple[int, int, str | None, int, str | None]]) -> None:
        for user, trigger, key, day, fault in events:
            self.sim.post(user, trigger, key, day, fault)

    @rule(user=users, trigger=triggers, key=keys, day=days, fault=faults)
    def post(self, user: int, trigger: int, key: str | None, day: int, fault: str | None) -> None:
        self.sim.post(user, trigger, key, day, fault)

    @rule(client=clients, user=users, trigger=triggers, key=keys, day=days)
    def begin_post(self, client: int, user: int, trigger: int, key: str | None, day: int) -> None:
        self.sim.begin_post(client, user, trigger, key, day)

    @precondition(lambda self: self.sim.requesting_clients())
    @rule(client=clients)
    def end_post(self, client: int) -> None:
        self.sim.end_post(client)

    @rule(row=st.integers(0, 8))
    def reset(self, row: int) -> None:
        self.sim.reset(row)

    @rule(row=st.integers(0, 8))
    def cancel(self, row: int) -> None:
        self.sim.cancel(row)

    @rule(minutes=st.sampled_from([1, 5, 20, 60, -30, 24 * 60]))
    def advance(self, minutes: int) -> None:
        self.sim.advance(minutes)

    # -- the replicas --------------------------------------------------------------------

    @precondition(lambda self: self.sim.idle_replicas())
    @rule(replica=replicas)
    def claim(self, replica: int) -> None:
        self.sim.claim(replica)

    @precondition(lambda self: self.sim.holding_replicas())
    @rule(replica=replicas)
    def dispatch(self, replica: int) -> None:
        self.sim.dispatch(replica)

    @precondition(lambda self: self.sim.holding_replicas())
    @rule(replica=replicas)
    def dispatch_again(self, replica: int) -> None:
        self.sim.dispatch(replica)

    @precondition(lambda self: self.sim.holding_replicas())
    @rule(replica=replicas)
    def finish(self, replica: int) -> None:
        self.sim.finish(replica)

    @precondition(lambda self: self.sim.idle_replicas())
    @rule(replica=replicas, stop_after=st.none() | st.integers(1, BATCH_SIZE))
    def run(self, replica: int, stop_after: int | None) -> None:
        self.sim.run(replica, stop_after)

    @precondition(lambda self: len(self.sim.idle_replicas()) > 1)
    @rule()
    def every_idle_replica_claims(self) -> None:
        """Batches side by side: the interleavings where replicas share participants."""
        for replica in self.sim.idle_replicas():
            self.sim.claim(replica)

    @precondition(lambda self: len(self.sim.holding_replicas()) > 1)
    @rule()
    def every_holding_replica_dispatches(self) -> None:
        for replica in self.sim.holding_replicas():
            self.sim.dispatch(replica)

    # -- faults --------------------------------------------------------------------------

    @precondition(lambda self: self.sim.live_holding_replicas())
    @rule(replica=replicas)
    def crash(self, replica: int) -> None:
        self.sim.crash(replica)

    @precondition(lambda self: self.sim.live_holding_replicas() or self.sim.busy_replicas())
    @rule(replica=replicas)
    def kill(self, replica: int) -> None:
        self.sim.kill(replica)

    @precondition(lambda self: self.sim.live_holding_replicas())
    @rule(replica=replicas)
    def stop(self, replica: int) -> None:
        self.sim.stop(replica)

    @rule(replica=replicas, where=st.sampled_from(["claim", "commit"]))
    def fail_next_poll(self, replica: int, where: str) -> None:
        self.sim.fail_next_poll(replica, where)

    @precondition(lambda self: self.sim.live_holding_replicas())
    @rule(replica=replicas)
    def freeze(self, replica: int) -> None:
        self.sim.freeze(replica)

    @rule(replica=replicas, minutes=st.sampled_from([-60, -5, 0, 5, 60]))
    def skew_clock(self, replica: int, minutes: int) -> None:
        self.sim.skew_clock(replica, minutes)

    # -- the oracle ----------------------------------------------------------------------

    @invariant()
    def committed_rows_equal_the_model(self) -> None:
        self.sim.oracle.check_rows()

    @invariant()
    def effects_are_exactly_those_of_committed_dispatches(self) -> None:
        self.sim.oracle.check_effects()

    @invariant()
    def no_participant_over_cap_and_no_key_sent_twice(self) -> None:
        self.sim.oracle.check_cap_and_dedup()

    @invariant()
    def replicas_without_a_batch_hold_no_locks(self) -> None:
        self.sim.oracle.check_idle_replicas()

    def teardown(self) -> None:
        try:
            if self.sim.violation is None:
                self.sim.drain()
        finally:
            self.sim.close()
