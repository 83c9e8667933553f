"""The backlog the fault scenarios drain, and the audit that says whether anything was lost.

One seed draws the whole backlog. Every event's fate is decided by construction, except the
order in which replicas meet them, so the audit can state exact equalities:

- the ids that end ``dispatched`` are exactly the events built to succeed, the ids that end
  ``failed`` exactly those built to fail, each with the reason the spec gives
  (``missing_or_invalid_time_scope``, ``no_rule_for_scenario``, ``missing_required_facts``);
  nothing is left ``pending``;
- each deduplication key of the succeeding events was claimed exactly once: one dedup row,
  one notification that is not ``suppressed_dedup``; at most one ``suppressed_dedup`` per key
  and one exactly when the key was sent more than once; no key has two ``sent``;
- each participant's ``sent`` count is exactly min(cap, distinct keys of an enabled kind), so
  nobody is over the cap and nobody was silently skipped; each ``sent`` has one delivery;
- an event given a window that had passed when the replicas met it (``with_windows``) ends
  ``expired``, with no notification and no key, whatever it would otherwise have become;
- over the whole run, one equality: every row's status is its planned fate (``expected``).
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, text

from scheduler.database.database import Database
from scheduler.database.queries import Statements

# the benchmarks' and scenarios' databases are in the default schema
STATEMENTS = Statements.of()

DAYS = ["2026-11-23", "2026-11-24", "2026-11-25", "2026-11-26", "2026-11-27"]
WEEKS = ["2026-W47", "2026-W48"]
FAIL_REASONS = ("missing_or_invalid_time_scope", "no_rule_for_scenario", "missing_required_facts")


@dataclass(frozen=True)
class Planned:
    id: str
    user_id: str
    facts: dict[str, Any]
    expected: str  # "dispatched", "failed" or "expired"
    reason: str | None = None  # the last_error prefix for a failure (or an expiry)
    key: str | None = None  # the dedup key a success claims
    kind: str | None = None
    window: timedelta | None = None  # expires_at is trigger_at plus this (EXP-1); None: never expires


@dataclass
class Backlog:
    seed: int
    events: list[Planned]
    caps: dict[str, int]
    disabled: dict[str, set[str]]

    @property
    def ids(self) -> list[str]:
        return sorted(e.id for e in self.events)


def plan_backlog(seed: int, events: int, users: int | None = None, prefix: str | None = None) -> Backlog:
    """Draw ``events`` due events over ``users`` participants (default: one per eight events),
    named ``{prefix}-{n}`` (default prefix: ``user-{seed}``)."""
    rng = random.Random(seed)
    users = users or max(1, events // 8)
    caps: dict[str, int] = {}
    disabled: dict[str, set[str]] = {}
    user_ids = [f"{prefix or f'user-{seed}'}-{i:05d}" for i in range(users)]
    for user in user_ids:
        roll = rng.random()
        if roll < 0.15:
            caps[user] = rng.choice([0, 1, 2])
        elif roll < 0.25:
            disabled[user] = {"reminder"}
    planned = []
    for _ in range(events):
        user = rng.choice(user_ids)
        event_id = str(uuid.UUID(int=rng.getrandbits(128)))
        roll = rng.random()
        base: dict[str, Any] = {"facts_version": "1.0"}
        if roll < 0.04:
            facts = {**base, "scenario": "commitment_reminder", "date": "30/11/2026", "commitment": "x"}
            planned.append(Planned(event_id, user, facts, "failed", "missing_or_invalid_time_scope"))
        elif roll < 0.08:
            facts = {**base, "scenario": "unheard_of", "date": rng.choice(DAYS)}
            planned.append(Planned(event_id, user, facts, "failed", "no_rule_for_scenario"))
        elif roll < 0.12:
            facts = {**base, "scenario": "commitment_reminder", "date": rng.choice(DAYS)}
            planned.append(Planned(event_id, user, facts, "failed", "missing_required_facts"))
        elif roll < 0.22:
            week = rng.choice(WEEKS)
            facts = {**base, "scenario": "self_consumption", "week": week, "self_consumption_pct": 35}
            key = f"weekly-self-consumption:{user}:community-1:{week}"
            planned.append(Planned(event_id, user, facts, "dispatched", key=key, kind="insight"))
        else:
            day = rng.choice(DAYS)
            facts = {**base, "scenario": "commitment_reminder", "date": day, "commitment": "run the dishwasher"}
            key = f"commitment-reminder:{user}:community-1:{day}"
            planned.append(Planned(event_id, user, facts, "dispatched", key=key, kind="reminder"))
    return Backlog(seed, planned, caps, disabled)


def joined(first: Backlog, second: Backlog) -> Backlog:
    """One backlog of two plans' events (of different participants), audited as one."""
    assert not {e.user_id for e in first.events} & {e.user_id for e in second.events}, "the plans share participants"
    return Backlog(first.seed, [*first.events, *second.events], {**first.caps, **second.caps},
                   {**first.disabled, **second.disabled})


def with_windows(backlog: Backlog, seed: int, *, share: float, passed: timedelta, open_for: timedelta) -> Backlog:
    """The backlog with a window on every event: ``share`` of them get ``passed`` (their expiry
    will have gone by when the replicas meet them: they must end ``expired``, whatever they were
    built to become), the others ``open_for`` (still worth sending: their planned fate holds)."""
    rng = random.Random(seed ^ 0x5EED)
    events = []
    for e in backlog.events:
        if rng.random() < share:
            events.append(Planned(e.id, e.user_id, e.facts, "expired", "expired: claimed", window=passed))
        else:
            events.append(Planned(e.id, e.user_id, e.facts, e.expected, e.reason, e.key, e.kind, window=open_for))
    return Backlog(backlog.seed, events, backlog.caps, backlog.disabled)


def seed_backlog(engine: Engine, backlog: Backlog, now: datetime | None = None,
                 overdue: timedelta = timedelta(hours=1)) -> None:
    """Store the backlog (due ``overdue`` ago, spread over a minute) and the participants' preferences."""
    now = now or datetime.now(UTC)
    sessions = Database(engine)
    with sessions.begin() as session:
        for user, cap in backlog.caps.items():
            sessions.decisions.set_preferences(session, user, enabled_kinds=None, max_per_day=cap, now=now)
        for user, kinds in backlog.disabled.items():
            enabled = sorted({"reminder", "insight", "summary"} - kinds)
            sessions.decisions.set_preferences(session, user, enabled_kinds=enabled, max_per_day=3, now=now)
        triggers = [now - overdue + timedelta(milliseconds=i * 10) for i in range(len(backlog.events))]
        rows = [
            {"id": e.id, "event_type": "reliability", "user_id": e.user_id, "community_id": "community-1",
             "external_key": None, "trigger_at": trigger_at,
             "expires_at": None if e.window is None else trigger_at + e.window,
             "facts": json.dumps(e.facts), "now": now, "traceparent": None}
            for e, trigger_at in zip(backlog.events, triggers, strict=True)
        ]
        session.execute(STATEMENTS["insert_event"], rows)


def pending_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM scheduled_events WHERE status = 'pending'")).scalar_one())


@dataclass
class Audit:
    """The outcome of a run: figures and every problem found (an empty list means nothing lost)."""

    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def check(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)

    @property
    def lost(self) -> int:
        return int(self.figures.get("lost", 0))


def audit_backlog(engine: Engine, backlog: Backlog) -> Audit:
    """Compare the database with what the backlog's construction says must have happened."""
    audit = Audit()
    users = {e.user_id for e in backlog.events}
    # Only the backlog's own rows: a scenario may post other events (to other participants).
    with engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(text(
            "SELECT id, status, last_error, dispatched_at FROM scheduled_events WHERE event_type = 'reliability'"))}
        notes = [n for n in conn.execute(text(
            "SELECT id, user_id, kind, dedup_key, status, reason, scheduled_event_id FROM notifications"))
            if n.user_id in users]
        dedup = {r.key: r for r in conn.execute(text("SELECT key, notification_id, duplicate_count FROM dedup_keys"))
                 if r.key.split(":")[1] in users}
        deliveries = Counter(r.notification_id for r in conn.execute(
            text("SELECT notification_id, user_id FROM deliveries WHERE status = 'sent'")) if r.user_id in users)
    planned = {e.id: e for e in backlog.events}
    statuses = Counter(r.status for r in rows.values())
    audit.figures.update(events=len(planned), dispatched=statuses["dispatched"], failed=statuses["failed"],
                         expired=statuses["expired"], pending=statuses["pending"])
    # the run's one equality: every row ended as planned (nothing lost, nothing both)
    fates = {i: r.status for i, r in rows.items()}
    planned_fates = {e.id: e.expected for e in backlog.events}
    audit.check(fates == planned_fates, f"{sum(fates.get(i) != s for i, s in planned_fates.items())} rows ended "
                "otherwise than planned")

    # every planned row exists and nothing else does
    audit.check(sorted(rows) == backlog.ids, f"rows in the table differ from the backlog: "
                f"{len(set(backlog.ids) - set(rows))} missing, {len(set(rows) - set(backlog.ids))} unexpected")
    want_dispatched = sorted(e.id for e in backlog.events if e.expected == "dispatched")
    got_dispatched = sorted(i for i, r in rows.items() if r.status == "dispatched")
    want_failed = sorted(e.id for e in backlog.events if e.expected == "failed")
    got_failed = sorted(i for i, r in rows.items() if r.status == "failed")
    audit.check(got_dispatched == want_dispatched,
                f"dispatched ids differ: {len(set(want_dispatched) - set(got_dispatched))} missing, "
                f"{len(set(got_dispatched) - set(want_dispatched))} unexpected")
    audit.check(got_failed == want_failed,
                f"failed ids differ: {len(set(want_failed) - set(got_failed))} missing, "
                f"{len(set(got_failed) - set(want_failed))} unexpected")
    audit.check(statuses["pending"] == 0, f"{statuses['pending']} rows still pending")
    want_expired = sorted(e.id for e in backlog.events if e.expected == "expired")
    got_expired = sorted(i for i, r in rows.items() if r.status == "expired")
    audit.check(got_expired == want_expired,
                f"expired ids differ: {len(set(want_expired) - set(got_expired))} missing, "
                f"{len(set(got_expired) - set(want_expired))} unexpected")
    wrong_reason = [i for i in (*got_failed, *got_expired) if i in planned and planned[i].reason
                    and not (rows[i].last_error or "").startswith(planned[i].reason or "")]
    audit.check(not wrong_reason, f"{len(wrong_reason)} failed rows with another reason, e.g. "
                f"{rows[wrong_reason[0]].last_error if wrong_reason else ''!r}")
    audit.check(all(r.dispatched_at is not None for r in rows.values() if r.status == "dispatched"),
                "a dispatched row without dispatched_at")
    audit.check(all(r.dispatched_at is None for r in rows.values() if r.status != "dispatched"),
                "a failed or pending row with dispatched_at")

    # deduplication: each key claimed exactly once
    succeeding = [e for e in backlog.events if e.expected == "dispatched"]
    uses = Counter(e.key for e in succeeding if e.key is not None)
    audit.check(sorted(dedup) == sorted(uses), f"dedup keys differ: {len(set(uses) - set(dedup))} unclaimed, "
                f"{len(set(dedup) - set(uses))} unexpected")
    claims = Counter(n.dedup_key for n in notes if n.reason != "suppressed_dedup")
    dups = Counter(n.dedup_key for n in notes if n.reason == "suppressed_dedup")
    sent = Counter(n.dedup_key for n in notes if n.status == "sent")
    audit.check(all(claims[k] == 1 for k in uses) and sum(claims.values()) == len(uses),
                "a dedup key with other than exactly one claiming notification")
    audit.check(all(dups[k] == (1 if uses[k] > 1 else 0) for k in uses) and sum(dups.values()) == sum(
        1 for k in uses if uses[k] > 1), "suppressed_dedup notifications do not match the repeated keys")
    audit.check(max(sent.values(), default=0) <= 1, "a dedup key with two sent notifications")
    audit.check(all(dedup[k].duplicate_count == uses[k] - 1 for k in uses if k in dedup),
                "a dedup key whose duplicate count is not its repeats")

    # the cap, exactly
    keys_by_user: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for e in succeeding:
        assert e.key is not None and e.kind is not None
        if e.kind not in backlog.disabled.get(e.user_id, set()):
            keys_by_user[e.user_id].add((e.key, e.kind))
    sent_by_user = Counter(n.user_id for n in notes if n.status == "sent")
    over = [u for u, n in sent_by_user.items() if n > backlog.caps.get(u, 3)]
    audit.check(not over, f"{len(over)} participants over their cap, e.g. {over[:3]}")
    wrong = [u for u in set(keys_by_user) | set(sent_by_user)
             if sent_by_user[u] != min(backlog.caps.get(u, 3), len(keys_by_user[u]))]
    audit.check(not wrong, f"{len(wrong)} participants whose sent count is not min(cap, distinct keys)")
    audit.check(all(deliveries[n.id] == (1 if n.status == "sent" else 0) for n in notes),
                "a notification whose deliveries do not match its status")
    audit.check(all(n.scheduled_event_id in planned and rows[n.scheduled_event_id].status == "dispatched"
                    for n in notes if n.scheduled_event_id in rows),
                "a notification whose scheduled event is not dispatched")

    audit.figures.update(notifications=len(notes), sent=sum(sent.values()), dedup_keys=len(dedup),
                         suppressed_dedup=sum(dups.values()),
                         rate_limited=sum(1 for n in notes if n.reason == "rate_limited"),
                         kind_disabled=sum(1 for n in notes if n.reason == "kind_disabled"))
    missing = (len(set(want_dispatched) - set(got_dispatched)) + len(set(want_failed) - set(got_failed))
               + len(set(want_expired) - set(got_expired)))
    audit.figures["lost"] = missing + statuses["pending"]
    return audit
