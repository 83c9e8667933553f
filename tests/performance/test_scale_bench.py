"""``python -m bench scale`` stays runnable: its whole path on two small tables (PERF-3).

The 10M-row run takes about 20 minutes and 8 GB; this runs the same code (the chunked
set-based load, the claim side by side, the console's pages and the /metrics scrape signed
in, every hot statement's plan, retention) on a few thousand rows, so a schema, a page or
a statement that changes under it fails here instead of in the next long run. Only the
shape of the results is checked, never a time.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from bench import cli, participant_index, report, scale
from bench.claim import PENDING
from bench.env import Server
from sqlalchemy import Engine, text

from tests.conftest import PgServer, libpq_url

SIZES = [1_500, 4_000]


@pytest.fixture
def bench_server(pg_server: PgServer) -> Server:
    """The test session's PostgreSQL as the benchmarks' server (fresh databases, dropped after)."""
    return Server(libpq_url("postgres", host=pg_server.host, port=pg_server.port, user=pg_server.user,
                            password=pg_server.password or None))


@pytest.mark.clause("PERF-3")
def test_the_scale_benchmark_runs_end_to_end_on_small_tables(
    bench_server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """PERF-3: loaded in chunks to exactly each size, every figure present at every size, a plan
    for every hot statement, retention deleted rows, and the tables and plans render."""
    monkeypatch.setattr(scale, "CHUNK", 1_000)  # several chunks even at these sizes
    result = scale.run(bench_server, sizes=SIZES, samples=10, budget=0.0, page_samples=2)

    for size in SIZES:
        entry: dict[str, Any] = result["sizes"][str(size)]
        assert sum(entry["load"]["by_status"].values()) == size
        assert entry["load"]["by_status"]["pending"] == PENDING
        assert entry["load"]["relation_bytes"]["scheduled_events"] > 0
        for key in ("claim", "claim_with_1_batches_held", "claim_with_3_batches_held", "claim_after_retention"):
            assert entry[key]["samples"] >= 10 and entry[key]["p99_ms"] >= entry[key]["median_ms"] > 0
        assert set(entry["pages"]) == {*scale.PAGES, scale.UNSERVED_PAGE[0]}
        assert set(entry["statements"]) == {*scale.hot_statements(), scale.UNSERVED_PAGE[0]}
        for label, figures in entry["statements"].items():
            assert figures["plan"]["text"], label
        claim_plan = entry["statements"]["claim"]["plan"]
        # the claim's scan, beside its expired step's (the pending-expiry index, then each row by key: EXP-2)
        assert sorted(s["index"] for s in claim_plan["scans"]) == [
            "ix_scheduled_events_pending_due", "ix_scheduled_events_pending_expiry", "pk_scheduled_events"]
        assert entry["retention"]["deleted"] > 0
    assert result["claim_ratio_largest_to_smallest"] > 0
    assert set(result["page_ratios"]) == set(scale.PAGES)

    results = {"started": "2026-11-30T00:00:00Z", "quick": True, "machine": {}, "benchmarks": {"scale": result}}
    json_path, md_path = report.write(results, tmp_path)
    assert "### Scale: 1,500, 4,000 rows" in md_path.read_text()
    plans = (tmp_path / f"{json_path.stem}-plans.md").read_text()
    assert plans.count("### claim: `claim_due_events`") == len(SIZES)


@pytest.mark.clause("PERF-3")
def test_the_scale_command_takes_its_sizes_and_stays_out_of_all() -> None:
    """PERF-3: ``python -m bench scale --rows N ...`` chooses the sizes; ``all`` does not run it."""
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args(["scale", "--quick", "--rows", "10000", "10000000"])
    assert args.bench_names == ("scale",) and args.rows == [10_000, 10_000_000] and args.quick
    assert "scale" not in parser.parse_args(["all"]).bench_names
    assert cli.FULL.scale_sizes == (10_000, 1_000_000, 10_000_000)


@pytest.mark.clause("PERF-3")
def test_the_participant_index_write_cost_measure_runs(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """PERF-3: ``python -m bench.participant_index`` (the write cost of the participant index) times a
    store and a batch's outcomes with and without the index, and leaves the index in place."""
    monkeypatch.setattr(participant_index, "ROUNDS", 1)
    scale._load(engine, 2_000)
    with engine.connect() as conn:
        result = participant_index.measure(conn)
        indexes = set(conn.execute(text("SELECT indexname FROM pg_indexes WHERE tablename = 'scheduled_events'"))
                      .scalars())
    assert set(result) == {"with index", "without index"}
    assert all(set(figures) == {"store", "outcome"} for figures in result.values())
    assert "ix_scheduled_events_user_id" in indexes
