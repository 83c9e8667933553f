"""PgBouncer in transaction mode: two prompt-mode replicas reach PostgreSQL only through a
real PgBouncer (``pool_mode = transaction``) while they drain a backlog and clients POST.

Behind transaction pooling every transaction may run on another server session, so the
replicas run with ``SCHEDULER_TRANSACTION_POOLING=true`` (no prepared statements, the
timeouts set per transaction) and LISTEN cannot work: each replica's listener must detect
that with its probe, log it once, and show ``wakeups: {"by": "timer", "reason": ...}`` in
``/health/scheduler``; the loop then wakes on its interval and the next pending trigger.
The audit must find nothing lost and nothing duplicated, every POST that answered 201 in
the table, and no poll that failed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
from sqlalchemy import Engine, text

from reliability.cluster import (
    Cluster,
    Replica,
    ScenarioError,
    cluster,
    drain_and_check,
    log,
    wait_for,
)
from reliability.pooler import PgBouncer
from reliability.report import report
from reliability.traffic import (
    CLIENT_EVENT_TYPE,
    Clients,
    HealthMonitor,
    check_clients,
    client_rows,
)
from reliability.workload import audit_backlog, plan_backlog, seed_backlog

# What the listener logs (once) when its probe finds LISTEN unusable.
FALLBACK_WARNING = "LISTEN/NOTIFY unavailable"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=3000, help="due events in the backlog (default 3000)")
    parser.add_argument("--clients", type=int, default=3, help="concurrent POSTing clients (default 3)")
    parser.add_argument("--pool-size", type=int, default=8,
                        help="PgBouncer's default_pool_size: server connections shared by both replicas (default 8)")
    parser.add_argument("--poll-seconds", type=float, default=1.0,
                        help="SCHEDULER_POLL_SECONDS, the timed wake-up without LISTEN (default 1)")
    parser.add_argument("--batch-size", type=int, default=20, help="SCHEDULER_BATCH_SIZE (default 20)")
    parser.add_argument("--timed", type=int, default=5,
                        help="reminders posted 2 s ahead after the drain, to time the fallback's wake-ups (default 5)")
    parser.add_argument("--timeout", type=float, default=300, help="give up waiting after this many seconds")


def run(args: argparse.Namespace) -> int:
    backlog = plan_backlog(args.seed, args.events)
    problems: list[str] = []
    figures: dict[str, Any] = {"seed": args.seed, "replicas": 2, "mode": "prompt", "pool_mode": "transaction"}
    database = f"rel_pgbouncer_{args.seed}"
    workdir = Path(args.workdir) / database
    with cluster(Path(args.pgdata), database, workdir, keep=args.keep) as c:
        with PgBouncer(c.pg.socket_dir, workdir, pool_size=args.pool_size) as bouncer:
            seed_backlog(c.engine, backlog)
            log(f"seeded {args.events} due events; starting 2 prompt-mode replicas behind pgbouncer")
            replicas = [
                c.add_replica(
                    i + 1,
                    DATABASE_URL=bouncer.url(database, application_name=f"replica-{i + 1}"),
                    SCHEDULER_MODE="prompt",
                    SCHEDULER_TRANSACTION_POOLING="true",
                    SCHEDULER_POLL_SECONDS=str(args.poll_seconds),
                    SCHEDULER_BATCH_SIZE=str(args.batch_size),
                )
                for i in range(2)
            ]
            started = time.monotonic()
            for replica in replicas:
                replica.start(wait=False)
            for replica in replicas:
                replica.wait_healthy(120)
            startup = time.monotonic() - started
            monitor = HealthMonitor(replicas, interval=0.25)
            clients = Clients(replicas, c.headers("nudging.ingest"), args.clients, args.seed)
            monitor.start()
            clients.start()
            try:
                wait_for(_Progress(c.engine, clients), args.timeout, "the backlog to drain", interval=0.2)
            except ScenarioError as exc:
                problems.append(str(exc))
            backlog_drained = time.monotonic() - started
            log(f"backlog drained in {backlog_drained:.1f}s; stopping the clients "
                f"({len(clients.figures.acknowledged)} POSTs acknowledged)")
            clients.stop()
            drained = drain_and_check(c.engine, args.timeout, problems, survivors=replicas) - started
            timed = _timed_reminders(c, replicas, args.timed, args.timeout, problems)
            monitor.stop()
            healths = [_health(replica) for replica in replicas]
            pooler = _pooler_figures(bouncer, database)
            for replica in replicas:
                replica.stop()
        for replica, health in zip(replicas, healths, strict=True):
            _check_fallback(replica, health, monitor, problems)
        client_figures = check_clients(clients.figures, c.engine, problems)
        audit = audit_backlog(c.engine, backlog)
        problems.extend(audit.problems)
        figures.update(audit.figures)
        figures.update(client_figures)
        figures.update(_lateness(c.engine))
        figures.update(timed)
        figures.update(pooler)
        figures.update(
            wakeups={h["name"]: h.get("wakeups", {}).get("by") for h in healths},
            fallback_reason=healths[0].get("wakeups", {}).get("reason"),
            polls=sum(int(h.get("polls", 0)) for h in healths),
            startup_seconds=round(startup, 1),
            backlog_drain_seconds=round(backlog_drained, 1),
            events_per_second=round(args.events / backlog_drained, 1) if backlog_drained else None,
            run_seconds=round(drained, 1),
            all_rows_per_second=(round((args.events + len(clients.figures.acknowledged)) / drained, 1)
                                 if drained else None),
        )
        figures["lost"] = audit.lost + len(clients.figures.acknowledged - set(client_rows(c.engine)))
        if problems:
            args.keep = c.keep = True  # the database and every log stay for a look
            log(f"keeping the database {database} and the logs in {workdir}")
    reproduce = (f"python -m reliability pgbouncer --seed {args.seed} --events {args.events} "
                 f"--clients {args.clients} --pool-size {args.pool_size} --poll-seconds {args.poll_seconds}")
    return report("pgbouncer", figures, problems, reproduce)


TIMED_EVENT_TYPE = "reliability-timed"
TIMED_LEAD_SECONDS = 2.0


def _timed_reminders(c: Cluster, replicas: list[Replica], count: int, timeout: float,
                     problems: list[str]) -> dict[str, Any]:
    """With the backlog gone, post ``count`` reminders due 2 s ahead (one at a time, to
    alternate replicas) and measure how late each is dispatched: without LISTEN, the loop
    learns of a future row at its next timed poll and then wakes at its trigger time."""
    if count <= 0:
        return {}
    log(f"posting {count} reminders {TIMED_LEAD_SECONDS:g} s ahead, one at a time, to time the timed wake-ups")
    lateness: list[float] = []
    with httpx.Client(timeout=30, headers=c.headers("nudging.ingest")) as http:
        for n in range(count):
            trigger_at = datetime.now(UTC) + timedelta(seconds=TIMED_LEAD_SECONDS)
            body = {"event_type": TIMED_EVENT_TYPE, "user_id": f"timed-{n}", "community_id": "community-1",
                    "trigger_at": trigger_at.isoformat(),
                    "facts": {"facts_version": "1.0", "scenario": "commitment_reminder", "date": "2026-11-30",
                              "commitment": "start the washing machine"}}
            response = http.post(f"{replicas[n % len(replicas)].base_url}/admin/scheduled-events", json=body)
            if response.status_code != 201:
                problems.append(f"a timed reminder was refused: {response.status_code} {response.text[:200]}")
                continue
            event_id = response.json()["id"]
            try:
                late = _wait_dispatched(c.engine, event_id, TIMED_LEAD_SECONDS + timeout, f"timed reminder {n}")
            except ScenarioError as exc:
                problems.append(str(exc))
                continue
            lateness.append(late)
    with c.engine.connect() as conn:
        notes = conn.execute(text(
            "SELECT count(*) FROM notifications n JOIN scheduled_events e ON e.id = n.scheduled_event_id "
            "WHERE e.event_type = :t"), {"t": TIMED_EVENT_TYPE}).scalar_one()
    if notes != count:
        problems.append(f"{count} timed reminders made {notes} notifications, not one each")
    if not lateness:
        return {}
    return {"timed_reminders": len(lateness), "timed_lateness_seconds": [round(x, 3) for x in lateness],
            "timed_lateness_median_seconds": round(statistics.median(lateness), 2),
            "timed_lateness_max_seconds": round(max(lateness), 2)}


def _wait_dispatched(engine: Engine, event_id: str, timeout: float, what: str) -> float:
    found = wait_for(lambda: _dispatched(engine, event_id), timeout, f"{what} to be dispatched", interval=0.02)
    assert found is not None  # wait_for returns only a truthy value
    return found[0]


def _dispatched(engine: Engine, event_id: str) -> tuple[float] | None:
    """(seconds from trigger_at to dispatched_at,) once the row is dispatched, else None."""
    with engine.connect() as conn:
        late = conn.execute(text(
            "SELECT EXTRACT(EPOCH FROM dispatched_at - trigger_at) FROM scheduled_events "
            "WHERE id = :id AND status = 'dispatched'"), {"id": event_id}).scalar()
    return None if late is None else (float(late),)


class _Progress:
    """The drain's condition for ``wait_for``, saying how far it is every ``every`` seconds."""

    def __init__(self, engine: Engine, clients: Clients, every: float = 5.0) -> None:
        self.engine, self.clients, self.every = engine, clients, every
        self.said_at = time.monotonic()

    def __call__(self) -> bool:
        pending = _backlog_pending(self.engine)
        if pending and time.monotonic() - self.said_at >= self.every:
            self.said_at = time.monotonic()
            log(f"{pending} backlog events pending; {len(self.clients.figures.acknowledged)} POSTs acknowledged")
        return pending == 0


def _backlog_pending(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM scheduled_events WHERE status = 'pending' AND event_type = 'reliability'"
        )).scalar_one())


def _health(replica: Replica) -> dict[str, Any]:
    try:
        _, body = replica.scheduler_health()
    except (httpx.HTTPError, ValueError) as exc:
        body = {"error": str(exc)}
    body["name"] = replica.name
    return body


def _check_fallback(replica: Replica, health: dict[str, Any], monitor: HealthMonitor, problems: list[str]) -> None:
    """The replica ran in prompt mode, found LISTEN unusable, said so once, and no poll failed."""
    wakeups = health.get("wakeups") or {}
    if health.get("mode") != "prompt":
        problems.append(f"{replica.name}: /health/scheduler shows mode {health.get('mode')!r}, not prompt")
    if wakeups.get("by") != "timer" or not wakeups.get("reason"):
        problems.append(f"{replica.name}: wake-ups did not fall back to the timer with a reason: {wakeups}")
    samples = [s for s in monitor.samples if s.replica == replica.name]
    by_listen = [s for s in samples if (s.body.get("wakeups") or {}).get("by") == "listen"]
    if by_listen:
        problems.append(f"{replica.name}: {len(by_listen)} health samples claimed LISTEN wake-ups behind pgbouncer")
    if health.get("last_error") or health.get("consecutive_failures"):
        problems.append(f"{replica.name}: a poll failed behind pgbouncer: {health.get('last_error')}")
    unhealthy = [s for s in samples if s.status != 200]
    if unhealthy:
        problems.append(f"{replica.name}: {len(unhealthy)} of {len(samples)} health samples were not 200, "
                        f"e.g. {unhealthy[0].status} {unhealthy[0].body}")
    warnings = replica.log_path.read_text(errors="replace").count(FALLBACK_WARNING)
    if warnings != 1:
        problems.append(f"{replica.name}: the fallback was logged {warnings} times, not once ({replica.log_path})")


def _lateness(engine: Engine) -> dict[str, Any]:
    """How long the clients' rows (stored already due) waited for their dispatch."""
    with engine.connect() as conn:
        waits = [float(w) for w in conn.execute(text(
            "SELECT EXTRACT(EPOCH FROM dispatched_at - greatest(trigger_at, created_at)) FROM scheduled_events "
            "WHERE event_type = :t AND status = 'dispatched'"), {"t": CLIENT_EVENT_TYPE}).scalars()]
    if not waits:
        return {}
    waits.sort()
    return {
        "client_lateness_p50_seconds": round(statistics.median(waits), 2),
        "client_lateness_p99_seconds": round(waits[min(len(waits) - 1, int(len(waits) * 0.99))], 2),
        "client_lateness_max_seconds": round(waits[-1], 2),
    }


def _pooler_figures(bouncer: PgBouncer, database: str) -> dict[str, Any]:
    """What PgBouncer saw: client connections multiplexed over its server connections."""
    try:
        stats = next((r for r in bouncer.admin("SHOW STATS") if r.get("database") == database), {})
        clients = sum(1 for r in bouncer.admin("SHOW CLIENTS") if r.get("database") == database)
        servers = sum(1 for r in bouncer.admin("SHOW SERVERS") if r.get("database") == database)
    except (psycopg.Error, ValueError) as exc:  # figures only: a failing admin console must not fail the run
        log(f"warning: pgbouncer's admin console did not answer: {exc}")
        return {}
    return {"pgbouncer_transactions": int(str(stats.get("total_xact_count", 0))),
            "pgbouncer_client_connections": clients,
            "pgbouncer_server_connections": servers}
