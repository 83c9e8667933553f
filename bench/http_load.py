"""Benchmark 4: storing events over HTTP, ``POST /admin/scheduled-events`` under uvicorn.

The server is the real thing: ``python -m scheduler serve`` on 127.0.0.1 (a free port),
in its own process, on a fresh database, with its polling loop running as in production
(the stored events fall due next year, so it never dispatches). The load comes from a
separate process: ``concurrency`` httpx clients on one event loop, each posting until the
phase's request count or time budget runs out. Phase ``new keys`` posts a fresh
``external_key`` each time (an INSERT); ``re-posted keys`` posts the same keys again
(the ON CONFLICT rewrite of REQ-0064). With ``batch_concurrency`` the same server also
takes ``POST /admin/scheduled-events/bulk``: events per second for batches of 100 and
1,000 from one client and from eight, beside the single POST from one client measured in
the same run (new keys throughout). Only loopback traffic; every loop is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.claim import percentile
from bench.drain import CTX
from bench.env import Server, libpq_uri, progress
from scheduler.web.http.auth import mint_token

SECRET = "bench-" + secrets.token_urlsafe(32)
TRIGGER_AT = "2027-11-30T09:00:00+00:00"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def body(key: str, user: int) -> dict[str, Any]:
    return {
        "event_type": "commitment",
        "user_id": f"user-{user}",
        "community_id": "bench-community",
        "external_key": key,
        "trigger_at": TRIGGER_AT,
        "facts": {"facts_version": "1", "scenario": "commitment_reminder",
                  "commitment": "run the dishwasher at noon", "date": "2027-11-30"},
    }


async def _phase(base: str, token: str, keys: list[str], concurrency: int, seconds: float) -> dict[str, Any]:
    import httpx

    latencies: list[float] = []
    statuses: dict[int, int] = {}
    position = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"},
                                 limits=limits, timeout=30) as client:

        async def client_task() -> None:
            nonlocal position
            while position < len(keys) and time.perf_counter() < deadline:
                index = position
                position += 1
                started = time.perf_counter()
                response = await client.post("/admin/scheduled-events", json=body(keys[index], index))
                latencies.append((time.perf_counter() - started) * 1000)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(client_task() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {
        "requests": len(latencies), "seconds": elapsed, "requests_per_second": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies), "p99_ms": percentile(latencies, 0.99),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
    }


BATCH_SIZES = (100, 1000)


async def _batch_phase(base: str, token: str, keys: list[str], size: int, concurrency: int,
                       seconds: float) -> dict[str, Any]:
    """``concurrency`` clients posting ``keys`` in batches of ``size`` until they or the time run out."""
    import httpx

    latencies: list[float] = []
    statuses: dict[int, int] = {}
    items: dict[int, int] = {}
    position = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"},
                                 limits=limits, timeout=120) as client:

        async def client_task() -> None:
            nonlocal position
            while position < len(keys) and time.perf_counter() < deadline:
                start = position
                position += size
                bodies = [body(keys[i], i) for i in range(start, min(start + size, len(keys)))]
                started = time.perf_counter()
                response = await client.post("/admin/scheduled-events/bulk", json=bodies)
                latencies.append((time.perf_counter() - started) * 1000)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                if response.status_code == 200:
                    for result in response.json():
                        items[result["status"]] = items.get(result["status"], 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(client_task() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    events = items.get(201, 0)
    return {
        "batch": size, "concurrency": concurrency, "requests": len(latencies), "events": events,
        "seconds": elapsed, "events_per_second": events / elapsed,
        "p50_ms": statistics.median(latencies), "p99_ms": percentile(latencies, 0.99),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "item_statuses": {str(k): v for k, v in sorted(items.items())},
    }


async def _batches(base: str, token: str, run_id: str, requests: int, concurrencies: tuple[int, ...],
                   seconds: float) -> dict[str, Any]:
    """The single POST from one client, then each batch size from each number of clients."""
    single = await _phase(base, token, [f"single-{run_id}-{i}" for i in range(requests)], 1, seconds)
    single["events_per_second"] = single["requests_per_second"]
    phases: dict[str, Any] = {"single POST, 1 client": single}
    for size in BATCH_SIZES:
        for concurrency in concurrencies:
            # enough keys for three batches per client, at least ten times the single POST's
            count = max(requests * 10, size * concurrency * 3)
            keys = [f"batch-{run_id}-{size}-{concurrency}-{i}" for i in range(count)]
            label = f"batch of {size:,}, {concurrency} client{'' if concurrency == 1 else 's'}"
            phases[label] = await _batch_phase(base, token, keys, size, concurrency, seconds)
    return phases


def _load(base: str, token: str, requests: int, concurrency: int, seconds: float, out: Any,
          batch_concurrency: tuple[int, ...] = ()) -> None:
    """The load process: a warm-up, then new keys, then the same keys re-posted; then the
    batch route's phases when ``batch_concurrency`` names them."""
    async def run() -> dict[str, Any]:
        run_id = secrets.token_hex(4)
        warm_keys = [f"warm-{run_id}-{i}" for i in range(min(200, requests))]
        warm = await _phase(base, token, warm_keys, concurrency, seconds)
        keys = [f"key-{run_id}-{i}" for i in range(requests)]
        new = await _phase(base, token, keys, concurrency, seconds)
        reposted = await _phase(base, token, keys[: new["requests"]], concurrency, seconds)
        result: dict[str, Any] = {"warm_up": warm, "new_keys": new, "reposted_keys": reposted}
        if batch_concurrency:
            result["batch"] = await _batches(base, token, run_id, requests, batch_concurrency, seconds)
        return result

    out.put(asyncio.run(run()))


def _wait_until_up(base: str, server: subprocess.Popen[bytes], seconds: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"scheduler serve exited with {server.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"scheduler serve did not answer {base}/health within {seconds:.0f}s")


def run(server: Server, *, requests: int, concurrency: int, seconds: float,
        batch_concurrency: tuple[int, ...] = ()) -> dict[str, Any]:
    """Requests per second and p50/p99 for new and re-posted keys, from a separate process;
    with ``batch_concurrency``, the batch route's events per second too."""
    if not _have_httpx():
        return {"skipped": "httpx is not installed (pip install -e '.[test]')"}
    with server.fresh_database("http") as url, tempfile.TemporaryDirectory() as data_dir:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = {**os.environ, "DATABASE_URL": libpq_uri(url), "SCHEDULER_JWT_SECRET": SECRET,
               "SCHEDULER_DATA_DIR": data_dir, "SCHEDULER_ENV": "development"}
        process = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "warning"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        try:
            _wait_until_up(base, process)
            progress(f"http: scheduler serve is up on {base}; {concurrency} clients, "
                     f"up to {requests:,} requests or {seconds:.0f}s per phase")
            out = CTX.Queue()
            token = mint_token(SECRET, scope="nudging.ingest", ttl_seconds=3600)
            load = CTX.Process(target=_load, args=(base, token, requests, concurrency, seconds, out, batch_concurrency),
                               daemon=True)
            cpu_before = cpu_seconds(process.pid)
            load.start()
            phases = 3 + (1 + len(BATCH_SIZES) * len(batch_concurrency) if batch_concurrency else 0)
            result: dict[str, Any] = out.get(timeout=phases * seconds + 120)
            load.join(timeout=10)
            server_cpu = cpu_seconds(process.pid) - cpu_before
        finally:
            process.terminate()
            try:
                _, stderr = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                _, stderr = process.communicate()
    for phase in ("new_keys", "reposted_keys"):
        r = result[phase]
        progress(f"http {phase}: {r['requests_per_second']:.0f} req/s, p50 {r['p50_ms']:.1f} ms, "
                 f"p99 {r['p99_ms']:.1f} ms, statuses {r['statuses']}")
        if set(r["statuses"]) != {"201"}:
            tail = stderr.decode(errors="replace")[-2000:]
            raise RuntimeError(f"http {phase}: unexpected statuses {r['statuses']}; server said:\n{tail}")
    for label, r in result.get("batch", {}).items():
        progress(f"http {label}: {r['events_per_second']:.0f} events/s, p50 {r['p50_ms']:.1f} ms, "
                 f"p99 {r['p99_ms']:.1f} ms, statuses {r['statuses']}")
        if (set(r["statuses"]) != {"200" if "batch" in r else "201"}
                or set(r.get("item_statuses", {"201": 0})) != {"201"}):
            tail = stderr.decode(errors="replace")[-2000:]
            raise RuntimeError(f"http {label}: unexpected statuses {r['statuses']}; server said:\n{tail}")
    total = sum(result[phase]["requests"] for phase in ("warm_up", "new_keys", "reposted_keys"))
    result.update(concurrency=concurrency, server="scheduler serve (uvicorn, one process)",
                  server_cpu_ms_per_request=server_cpu * 1000 / total)
    progress(f"http: the server process used {result['server_cpu_ms_per_request']:.2f} ms of CPU per request")
    return result


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _have_httpx() -> bool:
    import importlib.util

    return importlib.util.find_spec("httpx") is not None
