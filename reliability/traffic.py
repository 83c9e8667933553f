"""Load and observation during a fault: POSTing clients and a monitor of each replica's
loop health (``/admin/health/scheduler``, as an admin: the open route has no error text).

Each client posts scheduled events with its own external keys (opt-in idempotence,
REQ-0064), so a 503 can be retried with the same key: at the end the table must hold
exactly one row per key attempted, every one of them acknowledged with a 201.
"""

from __future__ import annotations

import itertools
import random
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import Engine, text

from reliability.cluster import Replica

CLIENT_EVENT_TYPE = "reliability-client"


@dataclass
class ClientFigures:
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    transport_errors: int = 0
    acknowledged: set[str] = field(default_factory=set)  # external keys that got a 201
    attempted: set[str] = field(default_factory=set)
    max_seconds: float = 0.0
    # (when it answered, how long it took) of each 201, in the order they came
    acknowledged_seconds: list[tuple[float, float]] = field(default_factory=list)
    max_503_seconds: float = 0.0
    bad_bodies: list[str] = field(default_factory=list)  # non-201 answers without a clear JSON detail
    no_retry_after: int = 0  # 503 answers without a Retry-After header (REL-20 gives every one)
    ids: dict[str, str] = field(default_factory=dict)  # external key -> row id from the 201


class Clients:
    """``count`` threads POSTing to random replicas until stopped; a 503 is retried (same key)."""

    def __init__(self, replicas: list[Replica], headers: dict[str, str], count: int, seed: int,
                 timeout: float = 30.0) -> None:
        self.replicas = replicas
        self.headers = headers
        self.count = count
        self.seed = seed
        self.timeout = timeout
        self.figures = ClientFigures()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._keys = itertools.count()

    def start(self) -> None:
        for n in range(self.count):
            thread = threading.Thread(target=self._run, args=(n,), name=f"client-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout + 120)

    def _body(self, key: str) -> dict[str, Any]:
        return {
            "event_type": CLIENT_EVENT_TYPE, "user_id": f"client-{key}", "community_id": "community-1",
            "external_key": key, "trigger_at": (datetime.now(UTC) - timedelta(seconds=1)).isoformat(),
            "facts": {"facts_version": "1.0", "scenario": "commitment_reminder", "date": "2026-11-30",
                      "commitment": "answer the door"},
        }

    def _run(self, n: int) -> None:
        rng = random.Random(self.seed * 1000 + n)
        with httpx.Client(timeout=self.timeout) as http:
            while not self._stop.is_set():
                key = f"c{self.seed}-{n}-{next(self._keys)}"
                with self._lock:
                    self.figures.attempted.add(key)
                # Retry the same key until it is acknowledged; stopping waits for that.
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    replica = rng.choice(self.replicas)
                    if self._post(http, replica, key):
                        break
                    threading.Event().wait(0.1)  # a pause between retries, even while stopping

    def _post(self, http: httpx.Client, replica: Replica, key: str) -> bool:
        started = time.monotonic()
        try:
            response = http.post(f"{replica.base_url}/admin/scheduled-events", json=self._body(key),
                                 headers=self.headers)
        except httpx.HTTPError:
            with self._lock:
                self.figures.requests += 1
                self.figures.transport_errors += 1
            return False
        elapsed = time.monotonic() - started
        with self._lock:
            f = self.figures
            f.requests += 1
            f.statuses[response.status_code] += 1
            f.max_seconds = max(f.max_seconds, elapsed)
            if response.status_code == 201:
                f.acknowledged_seconds.append((started + elapsed, elapsed))
                f.acknowledged.add(key)
                f.ids[key] = response.json()["id"]
                return True
            if response.status_code == 503:
                f.max_503_seconds = max(f.max_503_seconds, elapsed)
                f.no_retry_after += "retry-after" not in response.headers
            try:
                detail = response.json().get("detail")
            except ValueError:
                detail = None
            if not detail or "Traceback" in response.text:
                f.bad_bodies.append(f"{response.status_code}: {response.text[:200]}")
        return False


def client_rows(engine: Engine) -> dict[str, tuple[str, str]]:
    """external key -> (id, status) of every row the clients created."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT external_key, id, status FROM scheduled_events WHERE event_type = :t"),
                            {"t": CLIENT_EVENT_TYPE})
        return {r.external_key: (r.id, r.status) for r in rows}


def check_clients(figures: ClientFigures, engine: Engine, problems: list[str]) -> dict[str, Any]:
    """Every acknowledged POST is in the table, nothing else is, no answer was a 5xx other than 503, and
    every 503 said Retry-After."""
    rows = client_rows(engine)
    if sorted(rows) != sorted(figures.acknowledged):
        problems.append(f"client rows differ from the 201s: {len(figures.acknowledged - set(rows))} acknowledged "
                        f"but missing, {len(set(rows) - figures.acknowledged)} stored but never acknowledged")
    if figures.attempted != figures.acknowledged:
        problems.append(f"{len(figures.attempted - figures.acknowledged)} keys never acknowledged despite retries")
    wrong_id = [k for k, (row_id, _) in rows.items() if figures.ids.get(k) not in (None, row_id)]
    if wrong_id:
        problems.append(f"{len(wrong_id)} keys whose row id differs from the id their 201 returned")
    unexpected = {s: n for s, n in figures.statuses.items() if s not in (201, 503)}
    if unexpected:
        problems.append(f"unexpected statuses: {unexpected}")
    if figures.transport_errors:
        problems.append(f"{figures.transport_errors} requests got no HTTP answer at all")
    if figures.no_retry_after:
        problems.append(f"{figures.no_retry_after} answers 503 without a Retry-After header")
    if figures.bad_bodies:
        problems.append(f"{len(figures.bad_bodies)} error answers without a JSON detail, e.g. {figures.bad_bodies[0]}")
    return {
        "requests": figures.requests, "acknowledged_201": len(figures.acknowledged),
        "answered_503": figures.statuses.get(503, 0),
        "other_statuses": sum(n for s, n in figures.statuses.items() if s not in (201, 503)),
        "max_request_seconds": round(figures.max_seconds, 2), "max_503_seconds": round(figures.max_503_seconds, 2),
        "median_201_seconds": round(statistics.median(s for _, s in figures.acknowledged_seconds), 3)
        if figures.acknowledged_seconds else None,
        "client_rows_pending": sum(1 for _, status in rows.values() if status == "pending"),
    }


@dataclass
class HealthSample:
    at: float
    replica: str
    status: int | None  # None: no HTTP answer
    body: dict[str, Any]


class HealthMonitor:
    """Samples every replica's /admin/health/scheduler every ``interval`` seconds (the open
    route's fields and ``last_error``; an answer other than 200 or 503 is no sample's body)."""

    def __init__(self, replicas: list[Replica], interval: float = 0.1) -> None:
        self.replicas = replicas
        self.interval = interval
        self.samples: list[HealthSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as http:
            while not self._stop.is_set():
                for replica in self.replicas:
                    try:
                        status, body = replica.scheduler_health(http)
                        sample = HealthSample(time.monotonic(), replica.name, status, body)
                    except (httpx.HTTPError, ValueError):
                        sample = HealthSample(time.monotonic(), replica.name, None, {})
                    self.samples.append(sample)
                self._stop.wait(self.interval)

    def between(self, start: float, end: float) -> list[HealthSample]:
        return [s for s in self.samples if start <= s.at <= end]

    def healthy_now(self, http_timeout: float = 5) -> bool:
        """Every replica answers 200 with a loop that is running."""
        for replica in self.replicas:
            try:
                status, body = replica.scheduler_health(timeout=http_timeout)
            except (httpx.HTTPError, ValueError):
                return False
            if status != 200 or not body.get("running"):
                return False
        return True
