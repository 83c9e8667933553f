"""Benchmark 6: one replica's resident memory must not grow with the work it has done.

A separate process (so nothing else lives in it) runs production's loop (``poll_once``
back to back, the real ``NudgingPlatform`` by default) over ``events`` due rows for
distinct users, and reads its own RSS from /proc after the poll that passes 1,000
dispatched events and then after every tenth of the run, up to the last. The figure is
RSS at the end / RSS after 1,000.
"""

from __future__ import annotations

import time
from typing import Any

from bench.drain import CTX, make_scheduler
from bench.env import Server, bench_engine, load_events, progress, rss_bytes

FIRST = 1_000


def _replica(url: str, kind: str, events: int, out: Any) -> None:
    engine = bench_engine(url, pool_size=1, max_overflow=0)
    scheduler = make_scheduler(engine, kind, 20)
    samples: list[tuple[int, int]] = []
    marks = sorted({FIRST, *(events * k // 10 for k in range(1, 10))} - {0})
    done = 0
    started = time.perf_counter()
    while True:
        report = scheduler.poll_once()
        done += report.dispatched
        if report.claimed == 0:
            break
        while marks and done >= marks[0]:
            marks.pop(0)
            if not samples or samples[-1][0] != done:
                samples.append((done, rss_bytes()))
    samples.append((done, rss_bytes()))
    out.put({"samples": samples, "dispatched": done, "seconds": time.perf_counter() - started})
    engine.dispose()


def run(server: Server, *, events: int, kind: str = "full") -> dict[str, Any]:
    """RSS after 1,000 and after ``events`` dispatched events, one replica, one process."""
    with server.fresh_database("memory") as url:
        engine = bench_engine(url)
        try:
            load_events(engine, pending=events)
        finally:
            engine.dispose()
        out = CTX.Queue()
        process = CTX.Process(target=_replica, args=(url, kind, events, out), daemon=True)
        process.start()
        result: dict[str, Any] = out.get(timeout=1800)
        process.join(timeout=30)
    samples = result["samples"]
    first, last = samples[0], samples[-1]
    result.update(
        dispatcher="NudgingPlatform" if kind == "full" else "no-op",
        rss_after_first_mib=first[1] / 2**20, first_events=first[0],
        rss_at_end_mib=last[1] / 2**20, end_events=last[0],
        ratio=last[1] / first[1],
    )
    if result["dispatched"] != events:
        raise RuntimeError(f"memory: dispatched {result['dispatched']} of {events}")
    progress(f"memory: RSS {result['rss_after_first_mib']:.1f} MiB after {first[0]:,} events, "
             f"{result['rss_at_end_mib']:.1f} MiB after {last[0]:,} (x{result['ratio']:.3f})")
    return result
