"""The local-time scenario (SIM-LOCAL-*): participants in their own zones and quiet hours, the
clock stepped across a DST change, the production scheduler polling; and the broken variants
it must catch, each with the command that replays it.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, time, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from harness.local_model import (
    DST_ZONES,
    LOCAL_VARIANTS,
    QUIET_CHOICES,
    ZONES,
    Participant,
    seeded_world,
    transitions,
)
from harness.local_run import LocalTimeSimulation
from harness.types import Violation
from scheduler.cli import main
from scheduler.nudging.local_time import QuietHours

CI_STEPS = 150  # a run's size in CI: one to four seconds


def change_of(crossing: str) -> datetime:
    """The instant of a run's ``zone@instant`` crossing."""
    return datetime.strptime(crossing.split("@")[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


@pytest.fixture
def cli_env(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The command runs against this test's server; it creates and drops its own database."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("SCHEDULER_DATA_DIR", str(tmp_path))
    return tmp_path


# -- SIM-LOCAL-4: the world a seed makes -------------------------------------------------------------


@pytest.mark.clause("SIM-LOCAL-4")
def test_the_dst_changes_a_run_crosses_are_found_in_the_tz_database_to_the_second() -> None:
    """SIM-LOCAL-4: Berlin, New York and Lord Howe's changes of 2026-27, Lord Howe's at :30."""
    assert transitions("Europe/Berlin") == (datetime(2026, 10, 25, 1, tzinfo=UTC), datetime(2027, 3, 28, 1, tzinfo=UTC))
    assert transitions("America/New_York") == (datetime(2026, 11, 1, 6, tzinfo=UTC),
                                               datetime(2027, 3, 14, 7, tzinfo=UTC))
    assert transitions("Australia/Lord_Howe") == (datetime(2026, 10, 3, 15, 30, tzinfo=UTC),
                                                  datetime(2027, 4, 3, 15, tzinfo=UTC))
    assert transitions("Asia/Kathmandu") == transitions("Pacific/Kiritimati") == transitions("UTC") == ()


@pytest.mark.clause("SIM-LOCAL-4")
def test_each_seed_starts_before_a_dst_change_of_its_first_participants_zone_and_the_seeds_give_every_zone() -> None:
    """SIM-LOCAL-4: the start is half an hour to twelve hours before a spring-forward or a
    fall-back of participant 0's zone; seven participants have the seven zones; across seeds
    every DST zone's both changes, wrapping quiet hours and none come up."""
    changes, quiet_seen = set(), set()
    for seed in range(200):
        start, crossing, people = seeded_world(random.Random(seed), 7)
        zone, change = crossing.split("@")[0], change_of(crossing)
        assert people[0].zone_name == zone and change in transitions(zone)
        assert timedelta(minutes=30) <= change - start < timedelta(hours=12)
        assert sorted(p.zone_name for p in people) == sorted(ZONES)
        changes.add(change)
        quiet_seen |= {None if p.quiet is None else (p.quiet.start, p.quiet.end) for p in people}
    assert changes == {c for z in DST_ZONES for c in transitions(z)}
    assert quiet_seen == {None if q is None else (time(q[0] // 60, q[0] % 60), time(q[1] // 60, q[1] % 60))
                          for q in QUIET_CHOICES}


# -- SIM-LOCAL-1 to SIM-LOCAL-3: the production scheduler -----------------------------------------------


@pytest.mark.clause("SIM-LOCAL-1")
@pytest.mark.clause("SIM-LOCAL-2")
@pytest.mark.clause("SIM-LOCAL-3")
@pytest.mark.clause("SIM-LOCAL-6")
@pytest.mark.parametrize("seed", [1, 2, 5, 6])
def test_the_production_scheduler_keeps_quiet_hours_the_local_cap_and_its_holds_across_a_dst_change(
        database_url: str, seed: int) -> None:
    """SIM-LOCAL-1..3, SIM-LOCAL-6: at CI size every invariant holds after every step and after
    the drain, the clock has crossed the run's DST change, and reminders were held."""
    with LocalTimeSimulation(database_url, seed=seed) as sim:
        sim.run(CI_STEPS)
        summary = sim.summary()
        assert sim.now() > change_of(sim.crossing), summary
    assert summary["holds"] > 0 and summary["sent"] > 0 and summary["rows"] > 20, summary


@pytest.mark.clause("SIM-LOCAL-3")
def test_a_reminder_held_across_berlins_spring_forward_is_dispatched_at_the_first_poll_after_its_not_before(
        database_url: str) -> None:
    """SIM-LOCAL-3: quiet 01:30 to 03:30 on 2027-03-28 lasts one real hour (02:00 to 03:00 is
    skipped): a reminder due at 01:35 CET is held until 03:30 CEST (01:30 UTC) and dispatched
    by the first poll after it, within one interval."""
    berlin = Participant("p0", "Europe/Berlin", QuietHours(time(1, 30), time(3, 30)), 3)
    start = datetime(2027, 3, 28, 0, 20, tzinfo=UTC)  # 01:20 CET
    with LocalTimeSimulation(database_url, seed=0, replicas=1,
                             world=(start, "Europe/Berlin@2027-03-28T01:00:00Z", [berlin])) as sim:
        sim.post(0, 15)  # due 00:35 UTC, 01:35 CET: quiet
        assert sim.tick(15).held == 1
        [row] = sim.model.rows.values()
        assert row.not_before == datetime(2027, 3, 28, 1, 30, tzinfo=UTC)
        assert sim.tick(30).claimed == 0  # 01:05 UTC: still held, not claimed
        assert sim.tick(30).dispatched == 1  # 01:35 UTC, 03:35 CEST
        sim.drain()
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            dispatched_at = conn.execute(text("SELECT dispatched_at FROM scheduler.scheduled_events")).scalar_one()
    finally:
        engine.dispose()
    assert dispatched_at == datetime(2027, 3, 28, 1, 35, tzinfo=UTC)


@pytest.mark.clause("SIM-LOCAL-6")
def test_a_fresh_seed_of_the_local_time_scenario_holds_every_invariant(database_url: str) -> None:
    """SIM-LOCAL-6: a seed of its own each run, printed first; a failure names its replay."""
    seed = random.SystemRandom().randrange(2**32)
    print(f"simulation seed: {seed}")
    with LocalTimeSimulation(database_url, seed=seed) as sim:
        try:
            sim.run(CI_STEPS)
        except Violation as violation:
            raise AssertionError(f"{violation}\nreplay: scheduler simulate --scenario local-time "
                                 f"--steps {CI_STEPS} --seed {seed}") from violation


# -- SIM-LOCAL-5: the broken variants, caught and replayed ------------------------------------------------

CATCHING_SEEDS = {"ignores-not-before": 1, "utc-cap-day": 2, "ignores-quiet-hours": 3, "utc-quiet-hours": 1}


@pytest.mark.clause("SIM-LOCAL-5")
def test_every_broken_local_variant_has_a_seed_that_catches_it_below() -> None:
    """SIM-LOCAL-5: each variant of ``LOCAL_VARIANTS`` is one of the tests below."""
    assert set(CATCHING_SEEDS) == set(LOCAL_VARIANTS) - {"correct"}


@pytest.mark.clause("SIM-LOCAL-1")
@pytest.mark.clause("SIM-LOCAL-2")
@pytest.mark.clause("SIM-LOCAL-3")
@pytest.mark.clause("SIM-LOCAL-5")
@pytest.mark.parametrize("variant", sorted(CATCHING_SEEDS))
def test_each_broken_local_time_variant_is_caught_by_its_invariant_and_its_printed_command_replays_it(
        cli_env: Path, capsys: pytest.CaptureFixture[str], variant: str) -> None:
    """SIM-LOCAL-5: a claim that ignores not_before (SIM-LOCAL-3), a cap that counts the UTC day
    (SIM-LOCAL-2), a decision without quiet hours (SIM-LOCAL-1) or on the UTC clock
    (SIM-LOCAL-3): each stops the run at its invariant, prints the program's last steps and
    the replay command, and that command fails the same way at the same step."""
    seed = CATCHING_SEEDS[variant]
    args = ["simulate", "--scenario", "local-time", "--scheduler", variant, "--steps", str(CI_STEPS),
            "--seed", str(seed), "--replicas", "2"]
    assert main(args) == 1
    out, _ = capsys.readouterr()
    expected = LOCAL_VARIANTS[variant].expected
    assert out.splitlines()[0] == f"simulation seed: {seed}"
    [violated] = [line for line in out.splitlines() if line.startswith("INVARIANT VIOLATED: ")]
    assert violated.startswith(f"INVARIANT VIOLATED: {expected} violated at step"), out
    assert f"broken variant {variant!r} caught by {expected} as expected" in out
    assert "    sim.tick(" in out or "    sim.live(" in out
    replay = (f"replay: scheduler simulate --scenario local-time --steps {CI_STEPS} --seed {seed} "
              f"--replicas 2 --scheduler {variant}")
    assert replay in out.splitlines()
    replayed = replay.removeprefix("replay: scheduler ").split()
    assert main(replayed) == 1
    again, _ = capsys.readouterr()
    # the same invariant at the same step (a notification's id is random, a row's seeded)
    assert violated.split(": ")[1] in [line.split(": ")[1] for line in again.splitlines()
                                       if line.startswith("INVARIANT VIOLATED: ")]


@pytest.mark.clause("SIM-LOCAL-5")
def test_the_same_seed_replays_the_same_local_time_program_and_summary(database_url: str) -> None:
    """SIM-LOCAL-5: two runs of a seed take the same steps and end the same."""
    runs = []
    for _ in range(2):
        with LocalTimeSimulation(database_url, seed=4) as sim:
            sim.run(80)
            summary = sim.summary()
            runs.append((sim.program, summary))
    assert runs[0] == runs[1]


# -- SIM-LOCAL-6: the command ---------------------------------------------------------------------------


@pytest.mark.clause("SIM-LOCAL-6")
def test_a_clean_local_time_run_writes_one_json_document_with_its_world(
        cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SIM-LOCAL-6: ``--json`` is one document on stdout: clean, the participants, the crossing."""
    assert main(["simulate", "--scenario", "local-time", "--steps", "60", "--seed", "2", "--json"]) == 0
    out, err = capsys.readouterr()
    document = json.loads(out)
    assert document["result"] == "clean" and document["scenario"] == "local-time"
    assert len(document["participants"]) == 7 and "@" in document["crossing"]
    assert document["replay"] == "scheduler simulate --scenario local-time --steps 60 --seed 2"
    assert err.splitlines()[0] == "simulation seed: 2"


@pytest.mark.clause("SIM-LOCAL-6")
@pytest.mark.parametrize(("extra", "needle"), [
    (["--scenario", "local-time", "--dispatcher", "tests.simulation.host_example:FACTORY"], "--dispatcher"),
    (["--scenario", "local-time", "--scheduler", "batch-of-21"], "variant of the replica scenario"),
    (["--scenario", "local-time", "--shrink"], "does not shrink"),
    (["--scheduler", "utc-cap-day"], "variant of --scenario local-time"),
])
def test_arguments_the_scenario_cannot_run_are_a_sentence_and_exit_2(
        cli_env: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str) -> None:
    """SIM-LOCAL-6: a host's dispatcher, shrinking, or the other scenario's variant: exit 2."""
    assert main(["simulate", "--steps", "5", "--seed", "1", *extra]) == 2
    _, err = capsys.readouterr()
    assert needle in err
