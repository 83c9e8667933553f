"""Deliberately broken schedulers: a harness that never fails proves nothing.

Each variant is the production scheduler with one classic mistake put back in, as close
to the real code as possible: most rewrite a statement on the broken replica's own
connection (so ``Scheduler`` itself runs unchanged), one subclasses ``Scheduler``, and
one replaces the API's atomic upsert. ``expected`` names the invariant that must catch it.

Nothing is built at import: a variant's regex rewrites are compiled and checked against
queries.sql when a run asks for that variant (``Variant.build_rewrites``), so an edit to
production's SQL can only fail the variant whose target it removed, never an import of
the harness (or of the ``scheduler`` command).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from harness.faults import Rewrite, is_claim_statement
from scheduler.core.loop import Batch, Scheduler
from scheduler.core.store import event_to_json
from scheduler.database.queries import load_queries
from scheduler.types import SchedulerMode


class VariantNoLongerApplies(RuntimeError):
    """The production SQL changed and a broken variant's rewrite no longer matches it."""


@dataclass(frozen=True)
class Replace:
    """A rewrite of production SQL by regex (the one place where broken variants do), made
    when its variant is built. The guard: the pattern must match production's statements
    then, and a claim-only rewrite must match the claim each time it runs; either way a
    change to the targeted SQL fails loudly instead of leaving the variant silently correct."""

    pattern: str
    replacement: str
    claim_only: bool = True

    def build(self) -> Rewrite:
        """The rewrite, checked against queries.sql now (``VariantNoLongerApplies`` if stale)."""
        compiled = re.compile(self.pattern)
        if not any(compiled.search(q.sql) for q in load_queries().values()):
            raise VariantNoLongerApplies(f"{self.pattern!r} matches no statement of queries.sql any more")
        replacement, claim_only = self.replacement, self.claim_only

        def rewrite(sql: str, params: Any) -> tuple[str, Any]:
            if claim_only and not is_claim_statement(sql):
                return sql, params
            new, count = compiled.subn(replacement, sql)
            if claim_only and count == 0:
                raise VariantNoLongerApplies(f"{compiled.pattern!r} is not in the claim statement any more")
            return new, params

        return rewrite


def _claim_one_more(sql: str, params: Any) -> tuple[str, Any]:
    if is_claim_statement(sql) and isinstance(params, Mapping) and "batch_size" in params:
        params = {**params, "batch_size": int(params["batch_size"]) + 1}
    return sql, params


_SAVEPOINT = re.compile(r"^\s*(SAVEPOINT|ROLLBACK TO SAVEPOINT|RELEASE SAVEPOINT)\b", re.I)


def _no_savepoints(sql: str, params: Any) -> tuple[str, Any]:
    if _SAVEPOINT.match(sql):
        return "SELECT 1", params
    return sql, params


class CatchUpScheduler(Scheduler):
    """In prompt mode, after a full batch, "catches up" by claiming two batches' worth in
    the next poll: the loop's pacing is right, but one poll now exceeds the batch bound."""

    def claim(self) -> Batch:
        report = self.last_report
        catching_up = self.mode is SchedulerMode.PROMPT and report is not None and report.claimed >= self.batch_size
        if not catching_up:
            return super().claim()
        bound = self.batch_size
        self.batch_size = 2 * bound
        try:
            return super().claim()
        finally:
            self.batch_size = bound


class StatusFirstScheduler(Scheduler):
    """Marks every claimed row dispatched and commits that before the engine runs."""

    def claim(self) -> Batch:
        batch = super().claim()
        try:
            for event in batch.events:
                batch.session.execute(self.database.statements["mark_dispatched"],
                                      {"id": event.id, "now": batch.claimed_at})
            # The bug: the status commits apart from the effects, and the row locks go with it.
            batch.session.commit()
        except BaseException:
            self.abort(batch)
            raise
        return batch


# -- the API side: read-then-write instead of one atomic upsert ----------------------------

_READ_BY_KEY = text("SELECT id FROM scheduler.scheduled_events WHERE external_key = :external_key")
_INSERT_WITH_KEY = text(
    "INSERT INTO scheduler.scheduled_events (id, event_type, user_id, community_id, external_key, trigger_at,"
    " facts, status, created_at, updated_at) VALUES (:id, :event_type, :user_id, :community_id,"
    " :external_key, :trigger_at, CAST(:facts AS jsonb), 'pending', :now, :now) RETURNING *"
)
_UPDATE_BY_ID = text(
    "UPDATE scheduler.scheduled_events SET event_type = :event_type, user_id = :user_id,"
    " community_id = :community_id, trigger_at = :trigger_at, facts = CAST(:facts AS jsonb),"
    " status = 'pending', dispatched_at = NULL, last_error = NULL, updated_at = :now"
    " WHERE id = :existing RETURNING *"
)


def read_then_write_begin(session: Session, params: Mapping[str, Any]) -> str | None:
    """First half of the broken upsert: look the key up (no lock, no arbiter)."""
    row = session.execute(_READ_BY_KEY, {"external_key": params["external_key"]}).first()
    return None if row is None else str(row[0])


def read_then_write_end(session: Session, params: Mapping[str, Any], existing: str | None) -> dict[str, Any]:
    """Second half: insert if the read found nothing, else update by id; then commit."""
    if existing is None:
        row = session.execute(_INSERT_WITH_KEY, dict(params)).mappings().one()
    else:
        row = session.execute(_UPDATE_BY_ID, {**params, "existing": existing}).mappings().one()
    session.commit()
    return event_to_json(row)


@dataclass(frozen=True)
class Variant:
    """A scheduler build: production (``correct``) or one deliberate bug.

    Its description is plain data; its SQL rewrites (a ``Replace`` each, or a function that
    depends on no statement's text) are made by ``build_rewrites`` when a run uses it.
    """

    name: str
    description: str
    expected: str | None  # the SIM clause that must catch it
    rewrites: tuple[Replace | Rewrite, ...] = ()
    scheduler_class: type[Scheduler] = Scheduler
    read_then_write: bool = False
    modes: str | None = None  # forces the simulation's modes (a prompt-mode bug needs prompt)
    trusts_host_clock: bool = False  # the scheduler reads its host's wall clock (clocks.py)
    faults: frozenset[str] = frozenset()  # the driver's faults the bug needs to show (``skew``)

    def build_rewrites(self) -> list[Rewrite]:
        """The statement rewrites of this variant, each regex checked against queries.sql now;
        ``VariantNoLongerApplies`` names the one whose target SQL is gone."""
        built: list[Rewrite] = []
        for rewrite in self.rewrites:
            try:
                built.append(rewrite.build() if isinstance(rewrite, Replace) else rewrite)
            except VariantNoLongerApplies as exc:
                raise VariantNoLongerApplies(f"the {self.name} variant no longer applies: {exc}") from exc
        return built


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("correct", "the production scheduler, unchanged", None),
        Variant("no-skip-locked", "the claim locks with FOR UPDATE but without SKIP LOCKED",
                "SIM-1", rewrites=(Replace(r"FOR UPDATE SKIP LOCKED", "FOR UPDATE"),)),
        Variant("order-by-id", "the claim orders by id instead of (due_at, id): "
                "trigger_at's order when nothing is held",
                "SIM-1", rewrites=(Replace(r"ORDER BY (?:expired, )?(?:c\.)?due_at, (?:c\.)?id", "ORDER BY id"),)),
        Variant("batch-of-21", "the claim takes one row more than the batch size (21 for 20)",
                "SIM-1", rewrites=(_claim_one_more,)),
        Variant("one-transaction", "events run without savepoints: one failure rolls the batch back",
                "SIM-4", rewrites=(_no_savepoints,)),
        Variant("read-then-write-upsert", "a re-post reads the key, then inserts or updates",
                "SIM-2", read_then_write=True),
        Variant("cap-without-lock", "no participant advisory locks: the cap is counted unlocked",
                "SIM-6", rewrites=(Replace(r"pg_advisory_xact_lock\(", "abs(", claim_only=False),
                                   # the claim tries no lock: `true OR ...` is folded to true when planned
                                   Replace(r"WHERE pg_try_advisory_xact_lock\(",
                                           "WHERE true OR pg_try_advisory_xact_lock(",
                                            claim_only=False))),
        Variant("prompt-catch-up", "in prompt mode a full claim takes the next batch too, in the same poll",
                "SIM-1", scheduler_class=CatchUpScheduler, modes="prompt"),
        Variant("status-first", "status set before the engine runs and committed apart from it",
                "SIM-5", scheduler_class=StatusFirstScheduler),
        Variant("ignores-expiry", "the claim ignores expires_at: a row past its expiry is dispatched late",
                "SIM-EXPIRY", faults=frozenset({"expiry"}),
                rewrites=(Replace(r"AND \(expires_at IS NULL OR expires_at >= \S+\)(?=\s)", ""),
                          Replace(r"WHERE status = 'pending' AND expires_at < ", "WHERE false AND expires_at < "))),
        Variant("host-clock", "the scheduler reads its host's wall clock, not the database's",
                "SIM-10", trusts_host_clock=True, faults=frozenset({"skew"})),
    )
}


def variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown scheduler variant {name!r}; choose one of {', '.join(VARIANTS)}") from None
