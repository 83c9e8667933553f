"""``python -m bench delivery`` stays runnable: its whole path on a few reminders (PERF-10, PERF-11).

The full run (10,000 reminders, two replicas, a receiver answering after 100 ms) takes
minutes; this runs the same code on a handful, so a setting, a route or a peer's API that
changes under it fails here instead of in the next long run. Only the shape of the results
is checked, never a time. procrastinate and pgqueuer are optional (the ``bench`` extra, not
installed in CI): without them their rows say so.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from bench import cli, delivery, report
from bench.env import Server

from tests.conftest import PgServer, libpq_url


@pytest.fixture
def bench_server(pg_server: PgServer) -> Server:
    """The test session's PostgreSQL as the benchmarks' server (fresh databases, dropped after)."""
    return Server(libpq_url("postgres", host=pg_server.host, port=pg_server.port, user=pg_server.user,
                            password=pg_server.password or None))


@pytest.mark.clause("PERF-10")
@pytest.mark.clause("PERF-11")
def test_the_delivery_benchmark_runs_end_to_end_on_a_few_reminders(bench_server: Server, tmp_path: Path) -> None:
    """PERF-10: every reminder reaches the receiver through the outbox of two serve replicas and
    through the in-process publisher (extrapolated to N); each peer's row is a measurement or
    says why not; the table renders every row. PERF-11: a second round runs pgqueuer first and
    measures each system afresh."""
    result = delivery.run(bench_server, events=12, publisher_events=6, concurrency=4, workdir=tmp_path / "work",
                          rounds=2)
    systems: dict[str, dict[str, Any]] = {s["system"].split(",")[0]: s for s in result["systems"]}
    assert set(systems) == {"outbox", "in-process publisher", "procrastinate", "pgqueuer"}
    outbox, publisher = systems["outbox"], systems["in-process publisher"]
    assert outbox["delivered"] == 12 and outbox["replicas"] == 2 and outbox["p99_s"] >= outbox["p50_s"]
    # each round counted its own deliveries, after its own T (a receiver that kept an earlier
    # round's keys would have answered at once, before T)
    assert [r["first"] for r in result["rounds"]] == ["outbox", "pgqueuer"]
    assert len(outbox["rounds_p99_s"]) == 2 and min(outbox["rounds_p99_s"]) > 0
    assert all(r["pgqueuer_p99_s"] is None or r["pgqueuer_p99_s"] > 0 for r in result["rounds"])
    assert publisher["delivered"] == 6 and publisher["extrapolated_to"] == 12
    assert publisher["extrapolated_p99_s"] >= publisher["extrapolated_p50_s"] > 0
    for name in ("procrastinate", "pgqueuer"):
        assert systems[name].get("delivered") == 12 or systems[name].get("skipped"), systems[name]
    results = {"started": "2026-12-01T00:00:00Z", "quick": True, "machine": {}, "benchmarks": {"delivery": result}}
    _, md_path = report.write(results, tmp_path)
    table = md_path.read_text()
    assert "Trigger to delivered, 12 reminders due at once" in table
    assert all(f"| {s['system']} |" in table for s in result["systems"])


@pytest.mark.clause("PERF-11")
def test_the_delivery_command_takes_its_events_and_stays_out_of_all(capsys: pytest.CaptureFixture[str]) -> None:
    """PERF-11: ``python -m bench delivery --events N`` chooses N (default 10,000),
    ``--concurrency C`` the sends at once (default 256) and ``--batch-size B`` the outbox
    replicas' batch (default 100); ``--help`` says so; ``all`` does not run it."""
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args(["delivery", "--events", "2500", "--concurrency", "64", "--batch-size", "50",
                              "--rounds", "3"])
    assert args.bench_names == ("delivery",) and args.events == 2500
    assert (args.concurrency, args.batch_size, args.rounds) == (64, 50, 3)
    assert "delivery" not in parser.parse_args(["all"]).bench_names
    assert (cli.FULL.delivery_events, cli.FULL.delivery_concurrency, cli.FULL.delivery_batch,
            cli.FULL.delivery_rounds) == (10_000, 256, 100, 1)
    with pytest.raises(SystemExit):
        parser.parse_args(["delivery", "--help"])
    shown = capsys.readouterr().out
    assert "--events N" in shown and "--concurrency C" in shown and "--batch-size B" in shown
    assert "--rounds R" in shown


@pytest.mark.clause("PERF-11")
def test_rounds_report_each_systems_median_round_and_every_rounds_p99() -> None:
    """PERF-11: with ``--rounds``, a system's row is its median round by p99 (the lower middle
    one of an even count) carrying every round's p99, a peer skipped in a round is that row,
    and the table lists every round and how often the outbox was at or ahead of pgqueuer."""
    rounds = [{"system": "outbox", "p99_s": p, "p50_s": p / 2, "last_s": p, "events": 10} for p in (3.0, 2.0, 4.0, 2.5)]
    middle = delivery._median_round(rounds)
    assert middle["p99_s"] == 2.5 and middle["rounds_p99_s"] == [3.0, 2.0, 4.0, 2.5]
    skipped = {"system": "pgqueuer", "skipped": "not installed"}
    assert delivery._median_round([rounds[0], skipped]) == skipped
    section = {"events": 10, "latency_ms": 100, "replicas": 2, "concurrency": 4, "batch_size": 100,
               "target_p99_s": 5.0, "systems": [middle | {"meets_target": True}],
               "rounds": [{"first": "outbox", "outbox_p99_s": 3.0, "pgqueuer_p99_s": 2.9},
                          {"first": "pgqueuer", "outbox_p99_s": 2.0, "pgqueuer_p99_s": 2.8},
                          {"first": "outbox", "outbox_p99_s": 4.0, "pgqueuer_p99_s": None}]}
    text = "\n".join(delivery.table(section))
    assert "outbox p99 3.00 s / 2.00 s / 4.00 s; pgqueuer p99 2.90 s / 2.80 s / -" in text
    assert "the outbox at or ahead of pgqueuer in 1 of 2." in text
