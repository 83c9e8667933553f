"""The oracle: the whole-database invariants, checked through the observer after each step.

It reads only committed state (the observer's own connection) and compares it with the
model: the rows (SIM-2, SIM-4, SIM-5), the notifications that exist (SIM-4, SIM-5), the
caps and deduplication keys (SIM-6, the built-in platform's decisions: only when it runs),
idle replicas holding nothing (SIM-7), what a host's dispatch rolled back on purpose left
(SIM-HOST-8, the harness's own probe) and a host's own effects (SIM-12, the host's check).
A mismatch is the run's ``Violation``, raised through the simulation so it is recorded once.
"""

from __future__ import annotations

from harness.host import Outcome
from harness.model import Call
from harness.types import RunContext


class Oracle:
    """Checks one run's database against its model."""

    def __init__(self, sim: RunContext) -> None:
        self.sim = sim

    def check(self) -> None:
        """Every whole-database invariant, through the observer connection."""
        self.check_rows()
        self.check_effects()
        if self.sim.host is None:
            self.check_cap_and_dedup()
        self.check_idle_replicas()
        self.check_no_late_dispatch()
        if self.sim.host is not None and self.sim.host.check_every_step:
            self.check_host_effects()
        self.check_rollback_probe()  # after the host's own check, which names its rows better

    def check_rollback_probe(self) -> None:
        """A dispatch rolled back on purpose left no committed change outside the scheduler's
        schema, no outbox row and no pushed message (SIM-HOST-8, ``probe.py``): the harness's
        own check of a host's dispatcher, which needs nothing from the host."""
        sim = self.sim
        if sim.probe is None:
            return
        sim._check("SIM-HOST-8")
        sim.probe.pushed((r.name, r.scheduler.publisher) for r in sim.replicas)
        finding = sim.probe.first_finding()
        if finding is not None:
            raise sim.fail("SIM-HOST-8", finding.sentence())

    def check_host_effects(self) -> None:
        """The host's own check of its writes against every committed outcome (SIM-12)."""
        sim = self.sim
        host = sim.host
        if host is None or host.check_effects is None:
            return
        sim._check("SIM-12")
        outcomes = [Outcome(event_id, version, status) for event_id, _g, version, status in sim.model.processed]
        try:
            problem = host.check_effects(sim.observer.conn, outcomes)
        except AssertionError as exc:
            problem = str(exc) or repr(exc)
        if problem:
            raise sim.fail("SIM-12", f"the host's effects check: {problem}")

    def check_rows(self) -> None:
        """The committed rows equal the model's: statuses commit with their batch (SIM-5),
        content is the last post's (SIM-2), REQ-0067's columns follow the status (SIM-4)."""
        self.sim._check("SIM-5")
        db = self.sim.observer.rows()
        model = self.sim.model.rows
        if set(db) != set(model):
            lost = sorted(set(model) - set(db))
            extra = sorted(set(db) - set(model))
            raise self.sim.fail("SIM-2", f"rows lost {lost} / rows nobody posted {extra}")
        held = self.sim.model.held()
        for event_id, row in model.items():
            got = db[event_id]
            posted = (row.content.version, row.content.user, row.content.trigger_at)
            if (got.version, got.user_id, got.trigger_at) != posted:
                raise self.sim.fail("SIM-2", f"row {event_id} holds post v{got.version} for {got.user_id}, "
                                         f"but the last post was v{row.content.version} for {row.content.user}")
            if got.status != row.status:
                where = (f" (held by replica {held[event_id]}, whose batch has not committed)"
                         if event_id in held else "")
                raise self.sim.fail("SIM-5", f"row {event_id} is {got.status} in the database but "
                                         f"{row.status} in the model{where}")
            if (got.has_error, got.has_dispatched_at) != (row.has_error, row.has_dispatched_at):
                raise self.sim.fail("SIM-4", f"row {event_id} ({got.status}): last_error set={got.has_error}, "
                                         f"dispatched_at set={got.has_dispatched_at}")

    def _calls_by_notification(self) -> dict[str, Call]:
        calls = [*self.sim.model.committed_calls, *self.sim.model.discarded_calls]
        for batch in self.sim.model.batches.values():
            calls.extend(batch.calls)
        return {n: c for c in calls for n in c.notification_ids}

    def check_effects(self) -> None:
        """Exactly the notifications of committed successful dispatches exist (SIM-4, SIM-5)."""
        self.sim._check("SIM-5")
        seen: set[str] = set()
        stray_duplicates: list[str | None] = []
        for notification_id, event_id, _status, reason in self.sim.observer.notifications():
            if reason == "suppressed_dedup":
                if event_id not in self.sim.model.duplicate_events:
                    stray_duplicates.append(event_id)
                continue
            seen.add(notification_id)
        expected = self.sim.model.expected_notifications
        if seen == expected and not stray_duplicates:
            return
        calls = self._calls_by_notification()
        # A failed event's effects first: they explain a stray duplicate record too (its
        # replay found its own first attempt's key).
        for notification_id in sorted(seen - expected):
            call = calls.get(notification_id)
            if call is not None and call.result != "ok":
                raise self.sim.fail("SIM-4", f"notification {notification_id} of failed event {call.event_id} "
                                         "is visible: the failing event's effects were not rolled back")
        if stray_duplicates:
            raise self.sim.fail("SIM-5", f"a duplicate record for {stray_duplicates[0]}, whose duplicate dispatch "
                                     "never committed")
        for notification_id in sorted(seen - expected):
            call = calls.get(notification_id)
            raise self.sim.fail("SIM-5", f"notification {notification_id} (event {call.event_id if call else '?'}) "
                                     "is visible though its batch never committed")
        missing = sorted(expected - seen)
        raise self.sim.fail("SIM-5", f"committed notifications vanished: {missing}")

    def check_cap_and_dedup(self) -> None:
        """No participant above their daily cap; no dedup key sent twice (SIM-6)."""
        self.sim._check("SIM-6")
        for (user, day), sent in self.sim.observer.sent_per_day().items():
            cap = self.sim.caps.get(user)
            if cap is not None and sent > cap:
                raise self.sim.fail("SIM-6", f"{user} got {sent} notifications on {day}, cap {cap}")
        twice = self.sim.observer.keys_sent_twice()
        if twice:
            raise self.sim.fail("SIM-6", f"dedup keys sent more than once: {twice}")

    def check_no_late_dispatch(self) -> None:
        """Nothing is dispatched after its expiry by the reference clock (SIM-EXPIRY): no
        committed dispatch of a row whose batch claimed it after its expires_at."""
        sim = self.sim
        sim._check("SIM-EXPIRY")
        if sim.model.late_dispatches:
            event_id, claimed_at, expires_at = sim.model.late_dispatches[0]
            raise sim.fail("SIM-EXPIRY", f"{event_id} was dispatched by a batch claimed at {claimed_at:%H:%M}, "
                                         f"after its expires_at {expires_at:%H:%M}")

    def check_idle_replicas(self) -> None:
        """A replica without a batch holds no lock and no open transaction (SIM-7)."""
        self.sim._check("SIM-7")
        idle = {r.pid: r for r in self.sim.replicas if r.op is None and r.batch is None and r.pid}
        if not idle:
            return
        held = self.sim.observer.held_locks(idle)
        states = self.sim.observer.states(idle)
        for pid, r in idle.items():
            if held.get(pid) or states.get(pid) == "idle in transaction":
                raise self.sim.fail("SIM-7", f"{r.name} holds no batch but its backend is {states.get(pid)} "
                                         f"holding {held.get(pid)}")

    def check_nothing_lost(self) -> None:
        """After the drain, the run's one equality (SIM-5): nothing due is left pending, and
        every committed outcome, as the replicas' dispatchers saw it, equals the model's."""
        sim = self.sim
        sim._check("SIM-5")
        left = sim.model.due_pending(sim.now())
        if left:
            raise sim.fail("SIM-5", f"due rows never dispatched: {left}")
        seen = sorted((c.event_id, c.version, "dispatched" if c.result == "ok" else "failed")
                      for c in sim.model.committed_calls)
        expected = sorted((i, v, s) for i, _g, v, s in sim.model.processed)
        if seen != expected:
            raise sim.fail("SIM-5", "committed dispatches differ from the model's: "
                                    f"extra {sorted(set(seen) - set(expected))}, "
                                    f"missing {sorted(set(expected) - set(seen))}")
