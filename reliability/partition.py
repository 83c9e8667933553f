"""Partition: one replica freezes mid-batch while the others drain a backlog.

Two variants (``--variant proxy|process|both``, default both). *proxy*: the victim reaches
PostgreSQL only through a TCP proxy (``reliability.tcp_proxy``), which the scenario stops
with SIGSTOP while the victim holds a batch: a frozen network path, both sockets open.
*process*: the victim's own process is SIGSTOPped mid-batch (a paused VM, a long GC pause).
Either way PostgreSQL sees the victim's session sit ``idle in transaction`` holding its
batch's row locks and its participants' advisory locks, until
``SCHEDULER_IDLE_IN_TRANSACTION_TIMEOUT_MS`` (10 s by default) ends it.

Checked: every row the victim held (its batch and every pending row of its participants) is
dispatched by another replica within ``--bound`` (30 s) of the freeze; the victim's health
shows the stall while it lasts (a 503, or no answer from a stopped process); after the heal
the victim's batch fails whole (its poll fails, nothing it did commits) and it is healthy
again within ``--bound``; the backlog drains and the audit finds nothing lost, nothing
dispatched or notified twice, nobody over their cap.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
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
from reliability.frozen_backend import (
    backend_state,
    claim_behind_lock,
    frozen_batch,
    frozen_in_transaction,
    unread_bytes,
    waits_on_client,
)
from reliability.report import report
from reliability.tcp_proxy import TcpProxy
from reliability.workload import audit_backlog, pending_count, plan_backlog, seed_backlog

VARIANTS = ("proxy", "process")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant", choices=(*VARIANTS, "both"), default="both", help="what freezes (default both)")
    parser.add_argument("--events", type=int, default=2000, help="due events in the backlog (default 2000)")
    parser.add_argument("--replicas", type=int, default=3, help="scheduler serve processes, the victim included")
    parser.add_argument("--freeze-seconds", type=float, default=20.0, help="how long the victim stays frozen")
    parser.add_argument("--idle-timeout-ms", type=int, default=None,
                        help="SCHEDULER_IDLE_IN_TRANSACTION_TIMEOUT_MS (default: the service's, 10000)")
    parser.add_argument("--poll-seconds", type=float, default=0.5, help="SCHEDULER_POLL_SECONDS (default 0.5)")
    parser.add_argument("--batch-size", type=int, default=20, help="SCHEDULER_BATCH_SIZE (default 20)")
    parser.add_argument("--bound", type=float, default=30.0,
                        help="seconds within which the held rows must go out and the victim be healthy again")
    parser.add_argument("--timeout", type=float, default=600, help="give up draining after this many seconds")


def run(args: argparse.Namespace) -> int:
    variants = VARIANTS if args.variant == "both" else (args.variant,)
    problems: list[str] = []
    figures: dict[str, Any] = {"seed": args.seed, "replicas": args.replicas,
                               "idle_timeout_ms": 10_000 if args.idle_timeout_ms is None else args.idle_timeout_ms}
    lost = 0
    for variant in variants:
        lost += _run_variant(args, variant, figures, problems)
    figures["lost"] = lost
    reproduce = (f"python -m reliability partition --seed {args.seed} --variant {args.variant} "
                 f"--events {args.events} --freeze-seconds {args.freeze_seconds}")
    return report("partition", figures, problems, reproduce)


def _run_variant(args: argparse.Namespace, variant: str, figures: dict[str, Any], problems: list[str]) -> int:
    database = f"rel_partition_{variant}_{args.seed}"
    mine: list[str] = []
    with cluster(Path(args.pgdata), database, Path(args.workdir) / database, keep=args.keep) as c:
        backlog = plan_backlog(args.seed, args.events)
        seed_backlog(c.engine, backlog)
        env = {"SCHEDULER_POLL_SECONDS": str(args.poll_seconds), "SCHEDULER_BATCH_SIZE": str(args.batch_size)}
        if args.idle_timeout_ms is not None:
            env["SCHEDULER_IDLE_IN_TRANSACTION_TIMEOUT_MS"] = str(args.idle_timeout_ms)
        proxy: TcpProxy | None = None
        if variant == "proxy":
            proxy = TcpProxy(f"{c.pg.socket_dir}/.s.PGSQL.{_pg_port(c)}", c.workdir / "proxy.log")
            proxy.start()
        try:
            victim = c.add_replica(1, **env)
            if proxy is not None:
                victim.env["DATABASE_URL"] = (f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/{database}"
                                              f"?application_name={victim.name}")
            others = [c.add_replica(i + 2, **env) for i in range(args.replicas - 1)]
            for replica in [victim, *others]:
                replica.start(wait=False)
            for replica in [victim, *others]:
                replica.wait_healthy(60)
            started = time.monotonic()
            freeze = _freeze_mid_batch(c, victim, proxy, variant)
            (batch, participants), pid, frozen_at, tries = freeze
            log(f"[{variant}] froze {victim.name} mid-batch (backend {pid}, try {tries}) holding {len(batch)} rows "
                f"of its batch and the locks of {len(participants)} more pending rows of their participants")
            watch = Watch(c.engine, batch, participants, pid, frozen_at)
            stall = _watch_while_frozen(watch, victim, args)
            if proxy is not None:
                proxy.thaw()
            else:
                assert victim.process is not None
                victim.process.send_signal(signal.SIGCONT)
            thawed = time.monotonic()
            healthy_after = _healthy_again(victim, args.bound)
            while time.monotonic() - frozen_at < args.bound and not watch.all_out():
                watch.look()
                threading.Event().wait(0.2)
            drain_and_check(c.engine, args.timeout, mine, survivors=[victim, *others])
            watch.look()  # the participants' rows go out in the backlog's order, with the drain
            drained = time.monotonic() - started
            audit = audit_backlog(c.engine, backlog)
            mine.extend(audit.problems)
            failed_poll = "poll failed" in victim.log_path.read_text(errors="replace")
            prefix = f"{variant}_"
            figures.update({
                prefix + "freeze_tries": tries,
                prefix + "batch_rows_held": len(batch),
                prefix + "batch_rows_out_seconds": watch.out,
                prefix + "participant_rows_blocked": len(participants),
                prefix + "participant_rows_out_seconds": watch.participants_out,
                prefix + "session_ended_by_database_seconds": watch.ended,
                prefix + "health_during_freeze": stall["health"],
                prefix + "healthy_again_seconds": healthy_after,
                prefix + "frozen_batch_failed_on_resume": failed_poll,
                prefix + "drain_seconds": round(drained, 1),
                prefix + "dispatched": audit.figures.get("dispatched"),
                prefix + "notifications": audit.figures.get("notifications"),
            })
            if watch.out is None or watch.out > args.bound:
                mine.append(f"[{variant}] the rows of the frozen batch were not all dispatched by another replica "
                            f"within {args.bound:g}s of the freeze ({watch.out})")
            if watch.ended is None:
                mine.append(f"[{variant}] the database did not end the frozen session within the freeze")
            if not any(h != 200 for h in stall["health"]):
                mine.append(f"[{variant}] the victim's health never showed the stall: {stall['health']}")
            if healthy_after is None or healthy_after > args.bound:
                mine.append(f"[{variant}] the victim was not healthy again within {args.bound:g}s of the heal")
            if not failed_poll:
                mine.append(f"[{variant}] the victim's log shows no failed poll: its frozen batch did not fail")
            log(f"[{variant}] the batch's rows out {watch.out}s after the freeze; healthy again "
                f"{healthy_after}s after the heal ({time.monotonic() - thawed:.1f}s ago)")
            problems.extend(f"[{variant}] {p}" if not p.startswith("[") else p for p in mine)
            if mine:
                args.keep = c.keep = True
            return audit.lost
        finally:
            if proxy is not None:
                proxy.stop()
            for replica in c.replicas:
                if replica.alive():
                    replica.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]


def _pg_port(c: Cluster) -> int:
    from sqlalchemy import make_url

    return make_url(c.pg.url(c.database)).port or 5432


def _freeze_mid_batch(c: Cluster, victim: Replica, proxy: TcpProxy | None,
                      variant: str) -> tuple[tuple[list[str], list[str]], int, float, int]:
    """Freeze the victim inside a batch by construction: an operator's session holds
    ``LOCK TABLE scheduled_events IN EXCLUSIVE MODE`` (reads go on, claims wait) until the
    victim's claim waits behind it; the victim freezes, the lock goes, and the claim runs and
    answers a client that can send nothing more. The freeze counts only if the backend then
    sits inside that transaction with nothing of the victim's unread and pending rows carry
    it (``frozen_in_transaction``, ``frozen_batch``); otherwise (the claim found no due row)
    let it go on and try again, for up to two minutes.
    Returns the held rows, the frozen backend, when it froze, and how many tries it took."""
    deadline = time.monotonic() + 120
    tries = 0
    missed: list[str] = []  # why each try that did not count did not
    while time.monotonic() < deadline:
        tries += 1
        if tries > 1 and pending_count(c.engine) == 0:
            raise ScenarioError(f"the backlog drained before a freeze of {victim.name} landed inside a batch "
                                f"({variant}, {tries - 1} tries; the first misses: {missed[:3]}; the last: "
                                f"{missed[-2:]}): use more --events")
        operator = c.engine.connect()
        try:
            operator.execute(text("LOCK TABLE scheduled_events IN EXCLUSIVE MODE"))
            pid = wait_for(lambda: claim_behind_lock(c.engine, victim.name), 60,
                           f"{victim.name}'s claim to wait behind the table lock", interval=0.005)
            assert pid is not None
            if proxy is not None:
                proxy.freeze()
            else:
                assert victim.process is not None
                victim.process.send_signal(signal.SIGSTOP)
            frozen_at = time.monotonic()
        finally:
            operator.rollback()
            operator.close()
        # The claim runs once the lock goes, answering a frozen client: wait until its
        # backend has finished it, then look.
        try:
            wait_for(partial(waits_on_client, c.engine, pid), 10,
                     f"{victim.name}'s backend to finish what it was sent", interval=0.002)
        except ScenarioError as exc:
            raise ScenarioError(f"{exc}; the backend: {backend_state(c.engine, pid)}") from None
        held = None
        if not frozen_in_transaction(c.engine, pid):
            missed.append(f"not frozen in its transaction: {backend_state(c.engine, pid)}, "
                          f"{unread_bytes(pid)} bytes unread")
        elif (held := frozen_batch(c.engine, pid)) is None:
            missed.append(f"frozen in a transaction no pending row carries: {backend_state(c.engine, pid)}")
        if held is not None:
            if missed:
                log(f"[{variant}] {len(missed)} freezes did not land inside a batch first, e.g. {missed[-1]}")
            batch, participants = held
            return (batch, participants), pid, frozen_at, tries
        # the batch's last round trip got away before the freeze: let it go on, catch the next one
        if proxy is not None:
            proxy.thaw()
        else:
            assert victim.process is not None
            victim.process.send_signal(signal.SIGCONT)
    raise ScenarioError(f"could not freeze {victim.name} while it held a batch ({variant}, {tries} tries; "
                        f"the first misses: {missed[:3]}; the last: {missed[-2:]})")


class Watch:
    """When (seconds after the freeze) the batch's rows and the participants' rows were all
    out, and when the database ended the frozen session."""

    def __init__(self, engine: Engine, batch: list[str], participants: list[str], pid: int, frozen_at: float) -> None:
        self.engine, self.batch, self.participants = engine, batch, participants
        self.pid, self.frozen_at = pid, frozen_at
        self.out: float | None = None
        self.participants_out: float | None = None if participants else 0.0
        self.ended: float | None = None

    def all_out(self) -> bool:
        return self.out is not None and self.participants_out is not None

    def look(self) -> None:
        elapsed = round(time.monotonic() - self.frozen_at, 1)
        with self.engine.connect() as conn:
            def pending(ids: list[str]) -> int:
                return int(conn.execute(text(
                    "SELECT count(*) FROM scheduled_events WHERE status = 'pending' AND id = ANY(:ids)"),
                    {"ids": ids}).scalar_one())

            if self.out is None and not pending(self.batch):
                self.out = elapsed
            if self.participants_out is None and not pending(self.participants):
                self.participants_out = elapsed
            if self.ended is None and not conn.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": self.pid}).scalar_one():
                self.ended = elapsed


def _watch_while_frozen(watch: Watch, victim: Replica, args: argparse.Namespace) -> dict[str, Any]:
    """Until the freeze ends: the watch, and what the victim's /health/scheduler answered
    (None: no answer), each change once."""
    health: list[int | None] = []
    stop = threading.Event()
    while time.monotonic() - watch.frozen_at < args.freeze_seconds:
        watch.look()
        try:
            status: int | None = httpx.get(f"{victim.base_url}/health/scheduler", timeout=0.5).status_code
        except httpx.HTTPError:
            status = None
        if not health or health[-1] != status:
            health.append(status)
        stop.wait(0.25)
    return {"health": health}


def _healthy_again(victim: Replica, bound: float) -> float | None:
    """Seconds from the heal until the victim's /health/scheduler answers 200."""
    started = time.monotonic()

    def healthy() -> bool:
        try:
            return httpx.get(f"{victim.base_url}/health/scheduler", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, bound, f"{victim.name} to be healthy again", interval=0.1)
    except ScenarioError:
        return None
    return round(time.monotonic() - started, 1)
