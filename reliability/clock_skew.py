"""Clock skew: replicas whose host clocks are five minutes ahead and five minutes behind.

Each skewed replica is a real ``scheduler serve`` with Debian's libfaketime preloaded into
the process itself (``LD_PRELOAD`` and ``FAKETIME=+300s`` / ``-300s``; the ``faketime``
wrapper would fork, so the PID held would not be the server's). Three phases: the replica
behind alone, the replica ahead alone, then both together; in each, reminders are posted
through a replica's API, due a few seconds later by the database's clock. A watcher reads
the table every 20 ms on the database's own clock.

Checked for every reminder: it is first seen dispatched at or after its ``trigger_at`` by
the database's clock, and within ``--bound`` (prompt mode's usual lateness) of it; its
recorded ``dispatched_at`` and ``created_at`` are the database's time (inside the window
the watcher and the POST saw); exactly one notification. Each replica's
``scheduler_clock_offset_seconds`` shows its skew and its log warned about it once.
"""

from __future__ import annotations

import argparse
import glob
import random
import threading
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import jwt
from sqlalchemy import Engine, text

from reliability.cluster import Cluster, Replica, ScenarioError, cluster, log
from reliability.report import report

EVENT_TYPE = "reliability-clock"
PHASES = (("behind",), ("ahead",), ("behind", "ahead"))


def faketime_library() -> str | None:
    """Debian's libfaketime (package ``faketime``; scripts/system-packages installs it)."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reminders", type=int, default=20, help="reminders per phase (default 20)")
    parser.add_argument("--skew-seconds", type=int, default=300, help="how far the hosts are off (default 300)")
    parser.add_argument("--lead", type=float, default=3.0,
                        help="reminders fall due 1 to this many seconds after they are posted (default 3)")
    parser.add_argument("--bound", type=float, default=2.0,
                        help="a due reminder must leave within this many seconds of its trigger (default 2)")
    parser.add_argument("--timeout", type=float, default=120, help="give up waiting for a phase after this long")


def run(args: argparse.Namespace) -> int:
    library = faketime_library()
    if library is None:
        raise ScenarioError("libfaketime is missing: install Debian's faketime package (bash scripts/system-packages)")
    rng = random.Random(args.seed)
    problems: list[str] = []
    figures: dict[str, Any] = {"seed": args.seed, "skew_seconds": args.skew_seconds, "mode": "prompt"}
    database = f"rel_clock_skew_{args.seed}"
    with cluster(Path(args.pgdata), database, Path(args.workdir) / database, keep=args.keep) as c:
        hosts = {
            name: c.add_replica(index, SCHEDULER_MODE="prompt", LD_PRELOAD=library,
                                FAKETIME=f"{'+' if name == 'ahead' else '-'}{args.skew_seconds}s")
            for index, name in ((1, "ahead"), (2, "behind"))
        }
        for replica in hosts.values():
            replica.log_path.unlink(missing_ok=True)  # a kept earlier run's log would count twice
        # the token is minted with iat an hour back, so the host behind accepts it too
        headers = {"Authorization": f"Bearer {_token(c.secret)}"}
        lateness: list[float] = []
        posted_total = 0
        for phase in PHASES:
            running = [hosts[name] for name in phase]
            for replica in hosts.values():
                if replica.alive() and replica not in running:
                    replica.stop()
            for replica in running:
                if not replica.alive():
                    replica.start(wait=False)
            for replica in running:
                replica.wait_healthy(60)
            label = "+".join(phase)
            ids = _post_reminders(c, running, headers, args, rng, problems, label)
            posted_total += len(ids)
            seen = _watch(c.engine, ids, args.timeout)
            lateness.extend(_check_phase(c.engine, ids, seen, args, problems, label))
            log(f"[{label}] {len(ids)} reminders out; latest {max(lateness, default=0):.3f}s after its trigger")
        for name, replica in hosts.items():
            figures[f"{name}_clock_offset_seconds"] = _offset(replica, problems)
            expected = args.skew_seconds if name == "behind" else -args.skew_seconds
            got = figures[f"{name}_clock_offset_seconds"]
            if got is None or abs(got - expected) > 5:
                problems.append(f"{name}: scheduler_clock_offset_seconds is {got}, expected about {expected}")
            warnings = replica.log_path.read_text(errors="replace").count("this host's clock is")
            figures[f"{name}_skew_warnings"] = warnings
            if warnings != replica.starts:
                problems.append(f"{name}: {warnings} skew warnings in {replica.starts} starts (expected one each)")
        for replica in hosts.values():
            replica.stop()
        lost = _audit(c.engine, posted_total, problems)
        figures.update(reminders=posted_total, lateness_max_seconds=round(max(lateness, default=0.0), 3),
                       lateness_p50_seconds=round(sorted(lateness)[len(lateness) // 2], 3) if lateness else None,
                       early=sum(1 for value in lateness if value < 0), lost=lost)
        if problems:
            args.keep = c.keep = True
    reproduce = f"python -m reliability clock-skew --seed {args.seed} --reminders {args.reminders}"
    return report("clock-skew", figures, problems, reproduce)


def _token(secret: str) -> str:
    now = int(time.time())
    claims = {"sub": "clock-skew", "aud": "svc-nudging", "iat": now - 3600, "nbf": now - 3600,
              "exp": now + 24 * 3600, "scope": "nudging.ingest"}
    return jwt.encode(claims, secret, algorithm="HS256")


def _db_now(engine: Engine) -> datetime:
    with engine.connect() as conn:
        value = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
    assert isinstance(value, datetime)
    return value


def _post_reminders(c: Cluster, running: list[Replica], headers: dict[str, str], args: argparse.Namespace,
                    rng: random.Random, problems: list[str], label: str) -> list[str]:
    """Post ``--reminders`` reminders through the running replicas, each due 1 to ``--lead``
    seconds later by the database's clock; check each ``created_at`` is the database's."""
    ids = []
    for i in range(args.reminders):
        replica = running[i % len(running)]
        before = _db_now(c.engine)
        trigger = before + timedelta(seconds=rng.uniform(1.0, args.lead))
        body = {"event_type": EVENT_TYPE, "user_id": f"skew-{uuid.uuid4().hex[:12]}", "community_id": "community-1",
                "trigger_at": trigger.isoformat(),
                "facts": {"facts_version": "1.0", "scenario": "commitment_reminder",
                          "date": trigger.date().isoformat(), "commitment": "run the dishwasher"}}
        answer = httpx.post(f"{replica.base_url}/admin/scheduled-events", json=body, headers=headers, timeout=10)
        after = _db_now(c.engine)
        if answer.status_code != 201:
            problems.append(f"[{label}] POST to {replica.name} answered {answer.status_code}: {answer.text[:200]}")
            continue
        row = answer.json()
        created = datetime.fromisoformat(row["created_at"])
        if not before - timedelta(seconds=1) <= created <= after + timedelta(seconds=1):
            problems.append(f"[{label}] {replica.name} recorded created_at {created} outside the database's "
                            f"[{before}, {after}]")
        ids.append(row["id"])
    return ids


def _watch(engine: Engine, ids: list[str], timeout: float) -> dict[str, tuple[datetime, datetime]]:
    """For each id: the database's time of the last look that did not see it dispatched and
    of the first that did (every 20 ms)."""
    seen: dict[str, tuple[datetime, datetime]] = {}
    last = _db_now(engine)
    deadline = time.monotonic() + timeout
    stop = threading.Event()
    while len(seen) < len(ids) and time.monotonic() < deadline:
        with engine.connect() as conn:
            # statement_timestamp() precedes the statement's snapshot, clock_timestamp() (read
            # while it runs) follows it: a row first visible here committed between the two
            rows = conn.execute(text(
                "SELECT statement_timestamp() AS started, clock_timestamp() AS at, id "
                "FROM (SELECT 1) AS one LEFT JOIN scheduled_events "
                "ON status = 'dispatched' AND id = ANY(:ids)"), {"ids": ids}).all()
        at = max(row.at for row in rows)
        for row in rows:
            if row.id is not None and row.id not in seen:
                seen[row.id] = (last, at)
        last = rows[0].started
        stop.wait(0.02)
    return seen


def _check_phase(engine: Engine, ids: list[str], seen: dict[str, tuple[datetime, datetime]],
                 args: argparse.Namespace, problems: list[str], label: str) -> list[float]:
    with engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(text(
            "SELECT id, status, trigger_at, dispatched_at FROM scheduled_events WHERE id = ANY(:ids)"), {"ids": ids})}
    lateness = []
    for event_id in ids:
        row = rows.get(event_id)
        if row is None or event_id not in seen:
            problems.append(f"[{label}] reminder {event_id} was never dispatched ({row.status if row else 'missing'})")
            continue
        unseen_at, seen_at = seen[event_id]
        late = (seen_at - row.trigger_at).total_seconds()
        lateness.append(late)
        if seen_at < row.trigger_at:
            problems.append(f"[{label}] {event_id} left {-late:.1f}s before its trigger by the database's clock")
        elif late > args.bound:
            problems.append(f"[{label}] {event_id} left {late:.1f}s after its trigger (bound {args.bound:g}s)")
        if row.dispatched_at < row.trigger_at:
            problems.append(f"[{label}] {event_id} recorded dispatched_at before its trigger_at")
        if not unseen_at - timedelta(seconds=1) <= row.dispatched_at <= seen_at:
            problems.append(f"[{label}] {event_id} recorded dispatched_at {row.dispatched_at}, not the database's "
                            f"time of its dispatch (between {unseen_at} and {seen_at})")
    return lateness


def _offset(replica: Replica, problems: list[str]) -> float | None:
    try:
        body = httpx.get(f"{replica.base_url}/metrics", timeout=5).text
    except httpx.HTTPError as exc:
        problems.append(f"{replica.name}: /metrics unreachable ({exc})")
        return None
    for line in body.splitlines():
        if line.startswith("scheduler_clock_offset_seconds "):
            return round(float(line.split()[1]), 1)
    return None


def _audit(engine: Engine, posted: int, problems: list[str]) -> int:
    """Nothing lost (every posted reminder dispatched), nothing twice (one notification each)."""
    with engine.connect() as conn:
        statuses: dict[str, int] = dict(conn.execute(text(
            "SELECT status, count(*) FROM scheduled_events WHERE event_type = :t GROUP BY 1"), {"t": EVENT_TYPE}).all())
        twice = conn.execute(text(
            "SELECT count(*) FROM (SELECT scheduled_event_id FROM notifications GROUP BY 1 HAVING count(*) > 1) AS d"
        )).scalar_one()
        sent = conn.execute(text("SELECT count(*) FROM notifications WHERE status = 'sent'")).scalar_one()
    dispatched = int(statuses.get("dispatched", 0))
    if dispatched != posted or sent != posted:
        problems.append(f"{posted} reminders posted, {dispatched} dispatched, {sent} notifications sent")
    if twice:
        problems.append(f"{twice} reminders with more than one notification")
    return posted - dispatched
