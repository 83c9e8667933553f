"""Failover: the primary crashes under load and its standby is promoted; the replicas follow
it by their multi-host DATABASE_URL alone.

A primary and a standby streaming from it, made from the embedded server's own binaries
(``reliability.replication``: ``pg_basebackup -R``, synchronous by default, ``--standby async``
for the other case), on two loopback ports. Prompt-mode replicas reach them by a URL that names
both servers with ``target_session_attrs=read-write``, each replica in another of libpq's
spellings (``h1:p1,h2:p2`` before the database, ``?host=h1:p1,h2:p2``, repeated ``?host=``,
``?host=h1,h2&port=p1,p2``). They drain a backlog while clients POST; the primary is SIGKILLed
(every one of its processes) and the standby promoted a moment later.

With a synchronous standby the scenario requires: every POST that answered 201 is on the new
primary, with the id its 201 returned; nothing was pushed twice (the replicas' log of every
published notification, against both servers' tables); nothing is stuck (every row ends as
the backlog audit says, no advisory lock left); every replica survived, and its health answered
200 with ``wakeups.by == "listen"`` again within ``--recovery-deadline`` seconds of the
promotion, without a restart; the only answers were 201 and 503 with ``Retry-After``.

With ``--standby async`` the same run measures what a failover can lose: acknowledged POSTs
missing on the new primary, and notifications pushed from the old primary whose dispatch the
new one never saw and made again (read from the old primary's data, started on its own socket
after the run). Those are figures there, not failures; everything else is still required.

Its servers live in a fresh directory of their own (``--pgdata`` is not used); the replicas'
and both servers' logs are kept under ``--workdir`` when anything fails (or with ``--keep``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import secrets
import shutil
import statistics
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from reliability.cluster import (
    ROOT,
    Replica,
    ScenarioError,
    drain_and_check,
    free_port,
    log,
    wait_for,
)
from reliability.replication import ReplicatedPostgres
from reliability.report import report
from reliability.traffic import (
    CLIENT_EVENT_TYPE,
    Clients,
    HealthMonitor,
    check_clients,
    client_rows,
)
from reliability.workload import audit_backlog, plan_backlog, seed_backlog
from scheduler.config import Settings
from scheduler.database.engine import create_migrated_database, make_engine
from scheduler.web.http.auth import mint_token

# What the LoggingPublisher says for each notification it pushes (after its batch committed).
PUBLISHED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO scheduler\.nudging\.publishers: "
                       r"notification (\S+) \(\w+\) for ", re.M)

# Each way of writing "these two servers, the one that takes writes" (primary first).
URL_FORMS: dict[str, str] = {
    "netloc": "postgresql://postgres@127.0.0.1:{p1},127.0.0.1:{p2}/{db}?target_session_attrs=read-write",
    "host-port-list": "postgresql://postgres@/{db}?host=127.0.0.1:{p1},127.0.0.1:{p2}&target_session_attrs=read-write",
    "repeated-host": "postgresql://postgres@/{db}?host=127.0.0.1:{p1}&host=127.0.0.1:{p2}&target_session_attrs=read-write",
    "host-and-port-lists": ("postgresql://postgres@/{db}?host=127.0.0.1,127.0.0.1&port={p1},{p2}"
                            "&target_session_attrs=read-write"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--standby", choices=["sync", "async"], default="sync",
                        help="the standby's replication: sync (the primary waits for it on every commit) or async "
                             "(default sync)")
    parser.add_argument("--link-delay-ms", type=float, default=0.0,
                        help="latency of the standby's link to the primary, each way (a proxy that dies with the "
                             "primary, losing what it held; default 0: loopback)")
    parser.add_argument("--events", type=int, default=2000, help="due events in the backlog (default 2000)")
    parser.add_argument("--replicas", type=int, default=2, help="prompt-mode scheduler serve processes (default 2)")
    parser.add_argument("--clients", type=int, default=10, help="concurrent POSTing clients (default 10)")
    parser.add_argument("--seconds", type=float, default=40.0, help="seconds the clients post for (default 40)")
    parser.add_argument("--kill-at", type=float, default=10.0,
                        help="seconds into the load when the primary is SIGKILLed (default 10)")
    parser.add_argument("--promote-after", type=float, default=2.0,
                        help="seconds from the kill to the standby's promotion (default 2)")
    parser.add_argument("--url-form", choices=["each", *URL_FORMS], default="each",
                        help="how the replicas' DATABASE_URL names both servers: one form for all, or each replica "
                             "another (default each, starting from the seed)")
    parser.add_argument("--poll-seconds", type=float, default=2.0,
                        help="SCHEDULER_POLL_SECONDS, prompt mode's timed wake-up (default 2)")
    parser.add_argument("--recovery-deadline", type=float, default=15.0,
                        help="seconds after the promotion by which every replica must be healthy with LISTEN back "
                             "(default 15)")
    parser.add_argument("--timeout", type=float, default=300, help="give up waiting after this many seconds")


def run(args: argparse.Namespace) -> int:
    if args.kill_at >= args.seconds:
        raise SystemExit("--kill-at must come before the end of the load (--seconds)")
    synchronous = args.standby == "sync"
    backlog = plan_backlog(args.seed, args.events)
    problems: list[str] = []
    figures: dict[str, Any] = {"seed": args.seed, "standby": args.standby, "link_delay_ms": args.link_delay_ms,
                               "replicas": args.replicas, "clients": args.clients}
    database = f"rel_failover_{args.seed}"
    workdir = Path(args.workdir) / database
    workdir.mkdir(parents=True, exist_ok=True)
    pair = ReplicatedPostgres(synchronous=synchronous, log_dir=workdir, link_delay_ms=args.link_delay_ms)
    replicas: list[Replica] = []
    engine: Engine | None = None
    keep = args.keep
    try:
        pair.start()
        p1, p2 = pair.primary.port, pair.standby.port
        create_migrated_database(pair.primary.url("postgres"), database)
        # The scenario's own look at the data: whichever server takes writes (in libpq's own
        # host and port lists, which SQLAlchemy always passed on whole).
        both = URL_FORMS["host-and-port-lists"].format(p1=p1, p2=p2, db=database)
        engine = make_engine(both, Settings(statement_timeout_ms=120_000, lock_timeout_ms=0,
                                            idle_in_transaction_timeout_ms=0), pool_size=2, max_overflow=2)
        seed_backlog(engine, backlog)
        pair.wait_caught_up()
        secret = secrets.token_urlsafe(48)
        forms = list(URL_FORMS)
        for i in range(args.replicas):
            form = args.url_form if args.url_form != "each" else forms[(args.seed + i) % len(forms)]
            replicas.append(_replica(i + 1, form, URL_FORMS[form].format(p1=p1, p2=p2, db=database), secret,
                                     workdir, args))
        figures["url_forms"] = {r.name: r.env["RELIABILITY_URL_FORM"] for r in replicas}
        for replica in replicas:
            replica.start(wait=False)
        for replica in replicas:
            replica.wait_healthy(120)
        wait_for(lambda: all(_listening(r) for r in replicas), 60, "every replica's LISTEN connection")
        log(f"{args.replicas} prompt-mode replicas up ({figures['url_forms']}); {args.clients} clients post for "
            f"{args.seconds:g}s; the primary dies at {args.kill_at:g}s, the standby is promoted "
            f"{args.promote_after:g}s later")
        monitor = HealthMonitor(replicas, interval=0.1)
        clients = Clients(replicas, {"Authorization": f"Bearer {_token(secret, 'nudging.ingest')}"}, args.clients,
                          args.seed)
        monitor.start()
        started = time.monotonic()
        clients.start()
        pause = threading.Event()
        pause.wait(max(0.0, started + args.kill_at - time.monotonic()))
        acknowledged_before = len(clients.figures.acknowledged)
        killed_wall = datetime.now(UTC)
        processes = pair.kill_primary()
        assert pair.killed_at is not None
        log(f"SIGKILL to the primary's {processes} processes ({acknowledged_before} POSTs acknowledged so far)")
        pause.wait(max(0.0, pair.killed_at + args.promote_after - time.monotonic()))
        promoting_wall = datetime.now(UTC)
        pair.promote()
        promoted_wall = datetime.now(UTC)
        assert pair.promoted_at is not None
        log(f"standby promoted {pair.promoted_at - pair.killed_at:.1f}s after the kill "
            f"(pg_ctl promote took {pair.promotion_seconds or 0:.1f}s)")
        recovered = _recovery(monitor, replicas, pair.promoted_at, args.recovery_deadline, problems)
        pause.wait(max(0.0, started + args.seconds - time.monotonic()))
        clients.stop()
        log(f"clients stopped ({len(clients.figures.acknowledged)} POSTs acknowledged); draining")
        drain_and_check(engine, args.timeout, problems, survivors=replicas)
        figures.update(_stream_numbered(engine, replicas[0], secret, args.timeout, problems))
        monitor.stop()
        _check_outage(monitor, replicas, pair.killed_at, pair.promoted_at, figures)

        rows = client_rows(engine)
        missing = clients.figures.acknowledged - set(rows)
        measured = clients.figures
        if not synchronous:
            # an asynchronous standby may lack what the old primary acknowledged: measured below
            measured = dataclasses.replace(clients.figures, acknowledged=clients.figures.acknowledged - missing,
                                           attempted=clients.figures.attempted - missing)
        figures.update(check_clients(measured, engine, problems))
        figures["acknowledged_201"] = len(clients.figures.acknowledged)
        audit = audit_backlog(engine, backlog)
        problems.extend(audit.problems)
        figures.update(audit.figures)
        figures.update(recovered)
        figures.update(_latency(clients, pair.killed_at, pair.promoted_at + args.recovery_deadline))
        published = _published(replicas)
        figures.update(_timeline(engine, published, killed_wall, promoting_wall, promoted_wall))
        new_notes = _notifications(engine)
        for replica in replicas:
            replica.stop()
        engine.dispose()
        engine = None
        pair.stop_standby()
        with pair.old_primary():
            old_notes, old_keys = _old_primary(pair.old_primary_conninfo(database))
        twice, unpublished, old_only = _dispatches(published, new_notes, old_notes)
        figures.update(
            acknowledged_before_kill=acknowledged_before,
            acknowledged_missing=len(missing),
            acknowledged_missing_present_on_old_primary=len(missing & old_keys),
            published_notifications=sum(len(ids) for ids in published.values()),
            dispatched_twice=len(twice),
            dispatched_on_new_primary_never_published=len(unpublished),
            dispatched_never_published_examples=sorted(unpublished)[:3],
            dispatches_only_on_old_primary=len(old_only),
            primary_processes_killed=processes,
            promotion_seconds=round(pair.promotion_seconds or 0.0, 2),
            run_seconds=round(time.monotonic() - started, 1),
        )
        if synchronous:
            if twice:
                problems.append(f"{len(twice)} scheduled events were pushed twice (once from each primary), e.g. "
                                f"{sorted(twice)[:3]}")
        elif missing or twice:
            log(f"the asynchronous standby lacked {len(missing)} acknowledged POSTs and {len(old_only)} dispatches "
                f"of the old primary; {len(twice)} scheduled events were pushed twice")
        figures["lost"] = audit.lost + (len(missing) if synchronous else 0)
    except ScenarioError as exc:
        problems.append(str(exc))
    finally:
        for replica in replicas:
            try:
                replica.stop()
            except ScenarioError as exc:
                log(f"warning: {exc}")
        if engine is not None:
            engine.dispose()
        keep = keep or bool(problems)
        pair.close(keep=keep)
        if keep:
            log(f"kept the servers in {pair.root} and the logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    reproduce = (f"python -m reliability failover --seed {args.seed} --standby {args.standby} "
                 f"--link-delay-ms {args.link_delay_ms:g} --events {args.events} "
                 f"--replicas {args.replicas} --clients {args.clients} --seconds {args.seconds:g} "
                 f"--kill-at {args.kill_at:g} --promote-after {args.promote_after:g}")
    return report("failover", figures, problems, reproduce)


def _latency(clients: Clients, killed_at: float, settled_at: float) -> dict[str, Any]:
    """The median 201 before the kill (the old primary, its standby attached) and after the
    recovery (the new primary, alone): what waiting for a synchronous standby costs a POST."""
    before = [s for at, s in clients.figures.acknowledged_seconds if at < killed_at]
    after = [s for at, s in clients.figures.acknowledged_seconds if at > settled_at]
    return {"median_201_before_kill_seconds": round(statistics.median(before), 3) if before else None,
            "median_201_after_recovery_seconds": round(statistics.median(after), 3) if after else None}


def _unnumbered(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text(
            "SELECT count(*) FROM notifications WHERE status = 'sent' AND stream_seq IS NULL")).scalar_one())


def _stream_numbered(engine: Engine, replica: Replica, secret: str, timeout: float,
                     problems: list[str]) -> dict[str, Any]:
    """A participant's stream has no gaps (INBOX-15): whatever numbering the failover broke,
    a stream opened on a replica (its hub's next read) numbers it; every sent notification
    then has its stream number."""
    left = _unnumbered(engine)
    headers = {"Authorization": f"Bearer {mint_token(secret, scope=None, subject='stream-reader')}"}
    with httpx.Client(timeout=httpx.Timeout(timeout)) as http, \
            http.stream("GET", f"{replica.base_url}/me/notifications/stream", headers=headers) as response:
        if response.status_code != 200:
            problems.append(f"the stream answered {response.status_code} on {replica.name}")
            return {"stream_unnumbered_after_drain": left}
        try:
            wait_for(lambda: _unnumbered(engine) == 0, timeout, "every sent notification's stream number")
        except ScenarioError:
            problems.append(f"{_unnumbered(engine)} sent notifications never got a stream number")
    return {"stream_unnumbered_after_drain": left}


def _token(secret: str, scope: str) -> str:
    return mint_token(secret, scope=scope, ttl_seconds=24 * 3600)


def _replica(index: int, form: str, url: str, secret: str, workdir: Path, args: argparse.Namespace) -> Replica:
    name = f"replica-{index}"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_") and k != "DATABASE_URL"}
    environment.update({
        "DATABASE_URL": f"{url}&application_name={name}",
        "SCHEDULER_JWT_SECRET": secret,
        "SCHEDULER_DATA_DIR": str(workdir / name),
        "SCHEDULER_MODE": "prompt",
        "SCHEDULER_POLL_SECONDS": str(args.poll_seconds),
        "SCHEDULER_POOL_TIMEOUT_SECONDS": "2",
        "RELIABILITY_URL_FORM": form,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(ROOT) + os.pathsep + environment.get("PYTHONPATH", ""),
    })
    return Replica(name, free_port(), environment, workdir / f"{name}.log",
                   admin_headers={"Authorization": f"Bearer {_token(secret, 'nudging.admin')}"})


def _listening(replica: Replica) -> bool:
    try:
        status, body = replica.scheduler_health()
    except (OSError, ValueError):
        return False
    return status == 200 and (body.get("wakeups") or {}).get("by") == "listen"


def _recovery(monitor: HealthMonitor, replicas: list[Replica], promoted_at: float, deadline: float,
              problems: list[str]) -> dict[str, Any]:
    """Seconds from the promotion until each replica answered 200 with LISTEN back (from the
    monitor's samples); a replica that did not by ``deadline`` is a problem."""
    def back(replica: Replica) -> float | None:
        for sample in monitor.samples[:]:
            if (sample.replica == replica.name and sample.at >= promoted_at and sample.status == 200
                    and sample.body.get("running") and (sample.body.get("wakeups") or {}).get("by") == "listen"):
                return sample.at - promoted_at
        return None

    with contextlib.suppress(ScenarioError):
        wait_for(lambda: all(back(r) is not None for r in replicas), deadline + 5,
                 "every replica healthy with LISTEN back", interval=0.1)
    seconds = {r.name: back(r) for r in replicas}
    for name, value in seconds.items():
        if value is None or value > deadline:
            problems.append(f"{name}: not healthy with LISTEN back within {deadline:g}s of the promotion "
                            f"({'never' if value is None else f'{value:.1f}s'})")
    done = [v for v in seconds.values() if v is not None]
    return {"healthy_with_listen_seconds": {k: None if v is None else round(v, 2) for k, v in seconds.items()},
            "max_recovery_seconds": round(max(done), 2) if done else None}


def _check_outage(monitor: HealthMonitor, replicas: list[Replica], killed_at: float, promoted_at: float,
                  figures: dict[str, Any]) -> None:
    """What the replicas' health said between the kill and the promotion (figures only: a
    prompt replica with nothing to do may not poll in a short gap)."""
    samples = monitor.between(killed_at, promoted_at)
    figures["outage_health_samples"] = len(samples)
    figures["outage_health_503_samples"] = sum(1 for s in samples if s.status == 503)
    figures["outage_wakeups_by_timer_samples"] = sum(1 for s in samples
                                                     if (s.body.get("wakeups") or {}).get("by") == "timer")


def _timeline(engine: Engine, published: dict[str, list[tuple[str, datetime]]], killed: datetime,
              promoting: datetime, promoted: datetime) -> dict[str, Any]:
    """When the pushes stopped and resumed around the failover (from ``pg_ctl promote``'s
    return), by the replicas' log of each push (those between the kill and the promotion are
    batches that committed just before the kill); how long the clients' rows stored after the
    promotion waited for their dispatch."""
    pushes = sorted(at for pushed in published.values() for _, at in pushed)
    before = [at for at in pushes if at <= killed]
    after = [at for at in pushes if at >= promoting]
    with engine.connect() as conn:
        waits = sorted(float(w) for w in conn.execute(text(
            "SELECT EXTRACT(EPOCH FROM dispatched_at - created_at) FROM scheduled_events "
            "WHERE event_type = :t AND created_at >= :p AND status = 'dispatched'"),
            {"t": CLIENT_EVENT_TYPE, "p": promoted}).scalars())
    figures: dict[str, Any] = {
        "last_push_before_kill_seconds": round((killed - before[-1]).total_seconds(), 2) if before else None,
        "pushes_between_kill_and_promotion": sum(1 for at in pushes if killed < at < promoting),
        "pushes_resumed_after_promotion_seconds": round((after[0] - promoted).total_seconds(), 2) if after else None,
    }
    if waits:
        figures.update(client_wait_after_promotion_p50_seconds=round(statistics.median(waits), 3),
                       client_wait_after_promotion_max_seconds=round(waits[-1], 3))
    return figures


def _published(replicas: list[Replica]) -> dict[str, list[tuple[str, datetime]]]:
    """Notification id -> (the replica, when) of each push of it, from each replica's log (its
    lines carry the host's local time, as this process reads it)."""
    published: dict[str, list[tuple[str, datetime]]] = defaultdict(list)
    for replica in replicas:
        for match in PUBLISHED.finditer(replica.log_path.read_text(errors="replace")):
            at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").astimezone(UTC)
            published[match[2]].append((replica.name, at))
    return published


def _notifications(engine: Engine) -> dict[str, tuple[str | None, str]]:
    """Notification id -> (scheduled event id, status) on the new primary."""
    try:
        with engine.connect() as conn:
            return {r.id: (r.scheduled_event_id, r.status) for r in conn.execute(
                text("SELECT id, scheduled_event_id, status FROM notifications"))}
    except SQLAlchemyError as exc:
        raise ScenarioError(f"could not read the new primary's notifications: {exc}") from None


def _old_primary(conninfo: str) -> tuple[dict[str, tuple[str | None, str]], set[str]]:
    """What the killed primary had committed: its notifications, and the clients' keys."""
    try:
        with psycopg.connect(conninfo, connect_timeout=10) as conn:
            conn.execute("SET search_path = public, scheduler")
            notes = {str(r[0]): (r[1], str(r[2])) for r in conn.execute(
                "SELECT id, scheduled_event_id, status FROM notifications")}
            keys = {str(r[0]) for r in conn.execute(
                "SELECT external_key FROM scheduled_events WHERE event_type = %s", (CLIENT_EVENT_TYPE,))}
    except psycopg.Error as exc:
        raise ScenarioError(f"could not read the old primary's data: {exc}") from None
    return notes, keys


def _dispatches(published: dict[str, list[tuple[str, datetime]]], new: dict[str, tuple[str | None, str]],
                old: dict[str, tuple[str | None, str]]) -> tuple[set[str], set[str], set[str]]:
    """(scheduled events pushed under two notifications, events sent on the new primary whose
    notification was never pushed, notifications of the old primary the new one lacks)."""
    pushed: dict[str, set[str]] = defaultdict(set)
    for notification_id in published:
        event = (new.get(notification_id) or old.get(notification_id) or (None, ""))[0]
        if event is not None:
            pushed[event].add(notification_id)
    twice = {event for event, ids in pushed.items() if len(ids) > 1}
    twice |= {event for event, ids in pushed.items() for n in ids if len(published[n]) > 1}
    unpublished = {event for notification_id, (event, status) in new.items()
                   if status == "sent" and event is not None and notification_id not in published}
    old_only = {notification_id for notification_id in old if notification_id not in new}
    return twice, unpublished, old_only
