"""A run's results as a JSON file and a short Markdown table (bench/results/<timestamp>.*)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _f(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}"


def _mech_rate(runs: list[dict[str, Any]], kind: str, replicas: int, batch: int | None) -> float | None:
    """The events/s of the run of ``kind`` with ``replicas`` (and ``batch``, unless None)."""
    for r in runs:
        if r["kind"] == kind and r["replicas"] == replicas and "skipped" not in r and (
            batch is None or r.get("batch_size") == batch
        ):
            value: float = r["events_per_second"]
            return value
    return None


def claim_table(claim: dict[str, Any]) -> list[str]:
    lines = [
        f"### Claim latency ({claim['pending']:,} due pending rows, batch {claim['batch_size']}, "
        "the real claim statement)",
        "",
        "| rows in table | ours median ms | ours p90 ms | naive median ms | naive p90 ms | naive / ours | ours plan "
        "| ours, terminal by UPDATE, before VACUUM: median / p90 ms (buffers) | same after VACUUM: median ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for size, entry in claim["sizes"].items():
        ours, naive = entry["ours"], entry["naive"]
        scan = ours["explain"]["scans"][0] if ours["explain"]["scans"] else {}
        plan = f"{scan.get('node')} on {scan.get('index')}, {scan.get('shared_buffers')} buffers"
        updated, vacuumed = entry.get("ours_updated"), entry.get("ours_vacuumed")
        tail = " n/a | n/a |"
        if updated and vacuumed:
            dead = updated["explain"]["scans"][0]["shared_buffers"] if updated["explain"]["scans"] else "?"
            tail = (f" {_f(updated['median_ms'])} / {_f(updated['p90_ms'])} ({dead}) | "
                    f"{_f(vacuumed['median_ms'])} |")
        lines.append(
            f"| {int(size):,} | {_f(ours['median_ms'])} | {_f(ours['p90_ms'])} | {_f(naive['median_ms'])} | "
            f"{_f(naive['p90_ms'])} | {naive['median_ms'] / ours['median_ms']:.1f} | {plan} |" + tail
        )
    ratio = claim["ratio_largest_to_smallest"]
    met = "met" if claim["target_met"] else "MISSED"
    lines += ["", f"Largest / smallest table, median: ours **{ratio['ours']:.2f}x** (target <= 1.5x: {met}), "
              f"naive {ratio['naive']:.1f}x; ours with an UPDATE-made history "
              f"{ratio.get('ours_updated', float('nan')):.2f}x before VACUUM, "
              f"{ratio.get('ours_vacuumed', float('nan')):.2f}x after."]
    return lines


def retention_lines(claim: dict[str, Any]) -> list[str]:
    """The claim after an UPDATE-made history, with and without a retention run."""
    rows = [(size, e) for size, e in claim["sizes"].items() if e.get("ours_retained")]
    if not rows:
        return []
    lines = [
        "| rows in table | after VACUUM: median ms | after retention (before VACUUM): median / p90 ms "
        "| rows deleted | after retention and VACUUM: median ms |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for size, e in rows:
        kept, again = e["ours_retained"], e["ours_retained_vacuumed"]
        lines.append(f"| {int(size):,} | {_f(e['ours_vacuumed']['median_ms'])} | {_f(kept['median_ms'])} / "
                     f"{_f(kept['p90_ms'])} | {e['retention_deleted']:,} | {_f(again['median_ms'])} |")
    return lines


def history_table(history: dict[str, Any]) -> list[str]:
    lines = [
        f"### The history trigger on the dispatch path ({history['events']:,} events, one replica, "
        f"batch {history['batch_size']}, {history['rounds']} rounds, polls alternating trigger on and off)",
        "",
        "| dispatcher | with history: median us per event | without | cost per event | ratio |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for kind, entry in history["kinds"].items():
        medians = entry["median_ms_per_event"]
        lines.append(f"| {kind} | {medians['with_history'] * 1000:.0f} | {medians['without_history'] * 1000:.0f} | "
                     f"{entry['cost_per_event_us']:+.0f} us | {entry['slowdown']:.2f}x |")
    stream = history.get("stream")
    if stream:
        medians = stream["median_ms_per_event"]
        lines += ["", f"The inbox's stream publisher on the full path: {medians['with_stream'] * 1000:.0f} us per "
                  f"event with it, {medians['without_stream'] * 1000:.0f} us without "
                  f"({stream['cost_per_event_us']:+.0f} us, {stream['ratio']:.2f}x)."]
    return lines


def inbox_table(inbox: dict[str, Any]) -> list[str]:
    lines = [f"### From one replica's commit to a stream on another ({inbox['events']} notifications)", "",
             "| wake-up | median ms | p90 ms | max ms |", "| --- | ---: | ---: | ---: |"]
    for mode, entry in inbox["modes"].items():
        lines.append(f"| {mode} | {_f(entry['median_ms'], 1)} | {_f(entry['p90_ms'], 1)} | {_f(entry['max_ms'], 1)} |")
    return lines


def mechanics_table(mech: dict[str, Any]) -> list[str]:
    runs = mech["runs"]
    batches = sorted({r["batch_size"] for r in runs if r["kind"] in ("ours", "raw")})
    replicas = sorted({r["replicas"] for r in runs})
    head = "| replicas | " + " | ".join(f"ours b{b}" for b in batches) + " | " + \
        " | ".join(f"raw ceiling b{b}" for b in batches) + \
        " | raw, ours' statements b20 | procrastinate | pgqueuer b10 | pgqueuer b20 | ours / ceiling (b20) " \
        "| ours / raw with ours' statements | ours / procrastinate | ours / pgqueuer b10 | ours / pgqueuer b20 |"
    lines = [
        f"### Queue mechanics: {mech['events']:,} due events, no-op dispatcher, poll interval 0 (events/s)",
        "",
        head,
        "|" + " ---: |" * (len(head.split("|")) - 2),
    ]
    for n in replicas:
        def rate(kind: str, batch: int, n: int = n) -> float | None:
            return _mech_rate(runs, kind, n, batch)

        def peer(kind: str, n: int = n) -> float | None:
            return _mech_rate(runs, kind, n, None)

        ours20 = rate("ours", 20)
        cells = [_f(rate("ours", b), 0) for b in batches] + [_f(rate("raw", b), 0) for b in batches]
        cells += [_f(rate("raw_same", 20), 0), _f(peer("procrastinate"), 0), _f(rate("pgqueuer", 10), 0),
                  _f(rate("pgqueuer", 20), 0), _ratio(ours20, rate("raw", 20)), _ratio(ours20, rate("raw_same", 20)),
                  _ratio(ours20, peer("procrastinate")), _ratio(ours20, rate("pgqueuer", 10)),
                  _ratio(ours20, rate("pgqueuer", 20))]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    attempts = [f"{r['kind']} x{r['replicas']}: " + "/".join(f"{a:,.0f}" for a in r["attempts_events_per_second"])
                for r in runs if len(r.get("attempts_events_per_second", [])) > 1]
    if attempts:
        lines.append("\nBatch 20, ours and both raw loops: best of the interleaved attempts ("
                     + "; ".join(attempts) + ").")
    drivers = sorted({r["driver"] for r in runs if r.get("driver")})
    if drivers:
        lines.append(f"\npgqueuer driver: {', '.join(drivers)}.")
    skipped = sorted({r["skipped"] for r in runs if "skipped" in r})
    lines += [f"\nSkipped: {s}" for s in skipped]
    return lines


def full_table(full: dict[str, Any], mech: dict[str, Any] | None) -> list[str]:
    lines = [
        f"### Full path: {full['events']:,} due commitment reminders, real NudgingPlatform, batch 20",
        "",
        "| replicas | full path events/s | mechanics events/s | full / mechanics "
        "| dispatch cost per event (ms, one replica's time) |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in full["runs"]:
        n = run["replicas"]
        mech_rate = None
        if mech is not None:
            for r in mech["runs"]:
                if r["kind"] == "ours" and r["replicas"] == n and r["batch_size"] == 20:
                    mech_rate = r["events_per_second"]
        cost = None if mech_rate is None else (n / run["events_per_second"] - n / mech_rate) * 1000
        lines.append(f"| {n} | {_f(run['events_per_second'], 0)} | {_f(mech_rate, 0)} | "
                     f"{_ratio(run['events_per_second'], mech_rate)} | {_f(cost)} |")
    notes = full["runs"][0].get("notifications")
    if notes:
        lines.append(f"\nNotifications written by the one-replica run: {notes}")
    peer_runs = full.get("peers") or []
    if peer_runs:
        lines += ["", "The peers running the equivalent handler (dedup by a unique key, the notification and "
                  "its delivery row, in the handler's own transaction):", "",
                  "| system | replicas | batch | events/s | ours (full path) / peer |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for r in peer_runs:
            if "skipped" in r:
                lines.append(f"| {r['kind']} + work | {r['replicas']} | | skipped: {r['skipped']} | |")
                continue
            ours = next((o["events_per_second"] for o in full["runs"] if o["replicas"] == r["replicas"]), None)
            lines.append(f"| {r['kind']} + work | {r['replicas']} | {r['batch_size']} | "
                         f"{_f(r['events_per_second'], 0)} | "
                         f"{_ratio(ours, r['events_per_second'])} |")
    return lines


def formula_table(formula: list[dict[str, Any]]) -> list[str]:
    lines = [
        "### Drain time: T = P t_poll + (P - 1) p, with P = ceil(N / (R b))",
        "",
        "| N | replicas R | batch b | interval p (s) | t_poll at p=0 (s) | predicted s | t_poll in this run (s) | "
        "predicted with it s | measured s | measured / predicted (p=0 t_poll, this run's) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for f in formula:
        lines.append(f"| {f['events']:,} | {f['replicas']} | {f['batch_size']} | {f['poll_seconds']} | "
                     f"{f['poll_cost_seconds']:.4f} | {f['predicted_seconds']:.2f} | "
                     f"{f['run_poll_cost_seconds']:.4f} | "
                     f"{f['predicted_with_run_cost_seconds']:.2f} | {f['measured_seconds']:.2f} | "
                     f"{f['measured_over_predicted']:.2f}, {f['measured_over_predicted_with_run_cost']:.2f} |")
    return lines


def http_table(http: dict[str, Any]) -> list[str]:
    if "skipped" in http:
        return ["### Storing events over HTTP", "", f"Skipped: {http['skipped']}"]
    lines = [
        f"### Storing events over HTTP: POST /admin/scheduled-events, {http['concurrency']} concurrent "
        f"client{'' if http['concurrency'] == 1 else 's'}",
        "",
        "| phase | requests | requests/s | p50 ms | p99 ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for phase, label in (("new_keys", "new keys (insert)"), ("reposted_keys", "re-posted keys (upsert rewrite)")):
        r = http[phase]
        lines.append(f"| {label} | {r['requests']:,} | {r['requests_per_second']:.0f} | {r['p50_ms']:.1f} "
                     f"| {r['p99_ms']:.1f} |")
    if "server_cpu_ms_per_request" in http:
        lines.append(f"\nThe server process used {http['server_cpu_ms_per_request']:.2f} ms of CPU per request "
                     "(PostgreSQL's own time not included).")
    return lines


def batch_table(phases: dict[str, Any]) -> list[str]:
    """Events per second of POST /admin/scheduled-events/bulk beside the single POST of the same run."""
    single = phases["single POST, 1 client"]["events_per_second"]
    lines = [
        "### Storing events in batches: POST /admin/scheduled-events/bulk, beside the single POST",
        "",
        "| route | requests | events | events/s | x single POST (1 client) | p50 ms per request | p99 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, r in phases.items():
        events = r.get("events", r["requests"])
        lines.append(f"| {label} | {r['requests']:,} | {events:,} | {r['events_per_second']:,.0f} | "
                     f"{r['events_per_second'] / single:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    return lines


def shutdown_table(shutdown: dict[str, Any]) -> list[str]:
    lines = [
        f"### Shutdown with a {shutdown['poll_seconds']:.0f} s poll interval (stop to loop exit)",
        "",
        "| way the loop runs | samples | median ms | max ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name in ("run_blocking", "async_run", "service_lifespan"):
        r = shutdown[name]
        lines.append(f"| {name} | {r['samples']} | {r['median_ms']:.2f} | {r['max_ms']:.2f} |")
    return lines


def memory_table(memory: dict[str, Any]) -> list[str]:
    return [
        f"### Memory: one replica ({memory['dispatcher']} dispatcher)",
        "",
        "| RSS after events | MiB |",
        "| ---: | ---: |",
        f"| {memory['first_events']:,} | {memory['rss_after_first_mib']:.1f} |",
        f"| {memory['end_events']:,} | {memory['rss_at_end_mib']:.1f} |",
        "",
        f"Ratio end / first: **{memory['ratio']:.3f}** (samples: "
        + ", ".join(f"{n:,}: {b / 2**20:.1f}" for n, b in memory["samples"]) + " MiB)"
        + f"; {memory['end_events'] / memory['seconds']:.0f} events/s over the run",
    ]


def profile_table(profiles: dict[str, Any]) -> list[str]:
    lines = ["### Profile of one replica (batch 20, under cProfile; BEGIN/COMMIT not counted)", ""]
    for profile in profiles.values():
        shares = ", ".join(f"{k} {v:.0%}" for k, v in profile["share_of_time"].items())
        kinds = ", ".join(f"{k} x{v / profile['events']:.2f}" for k, v in profile["statements_by_kind"].items())
        lines += [
            f"- {profile.get('dispatcher', 'no-op')} dispatcher, {profile['events']:,} events: "
            f"**{profile['statements_per_event']:.2f} statements per event** ({kinds})",
            f"  - share of wall time (cumulative, overlapping): {shares}",
        ]
    return lines


def burst_table(burst: dict[str, Any]) -> list[str]:
    lines = [
        f"### Lateness: {burst['events']:,} reminders due at one instant, full dispatch path "
        "(dispatched_at - trigger_at, seconds)",
        "",
        "| system | mode | replicas | all out after (s) | lateness p50 | p99 | max | literal: drain / formula |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in burst["runs"]:
        if "skipped" in r:
            lines.append(f"| {r['system']} | n/a | {r['replicas']} | skipped: {r['skipped']} | | | | |")
            continue
        late = r["lateness"]
        mode = r["mode"] if r["system"] != "ours" else f"{r['mode']}, interval {r['poll_seconds']:g} s"
        formula = r.get("formula")
        check = "" if not formula else (f"{r['drain_seconds']:.1f} / {formula['predicted_low_seconds']:.1f}"
                                        f"-{formula['predicted_high_seconds']:.1f}")
        lines.append(f"| {r['system']} | {mode} | {r['replicas']} | {r['drain_seconds']:.2f} | {late['p50_s']:.2f} | "
                     f"{late['p99_s']:.2f} | {late['max_s']:.2f} | {check} |")
    for mode, reason in burst.get("skipped_modes", {}).items():
        lines.append(f"\n{mode} mode skipped: {reason}.")
    if burst.get("single"):
        lines += ["", "One reminder alone, stored while the loops wait, due 2 s later (2 replicas): "
                  + "; ".join(f"{s['mode']} mode, interval {s['poll_seconds']:g} s: dispatched "
                              f"**{s['lateness_seconds']:.2f} s** after its trigger" for s in burst["single"]) + "."]
    lines += ["", f"Stored through `store_event` at about {burst['store_rate']:.0f} reminders/s before the trigger; "
              "peers poll every second (a NOTIFY at enqueue time cannot wake them at the trigger)."]
    return lines


def markdown(results: dict[str, Any]) -> str:
    machine, server = results["machine"], results.get("server", {})
    lines = [
        f"## Benchmark run {results['started']} ({'quick' if results['quick'] else 'full'})",
        "",
        f"Machine: {machine.get('cores')} cores ({machine.get('cpu', '?')}), {machine.get('memory_gib', '?')} GiB, "
        f"load average at start {machine.get('load_average_at_start')}, at end {machine.get('load_average_at_end')}; "
        f"{server.get('version', '?').split(' on ')[0]} "
        f"({'embedded pgserver' if server.get('embedded') else 'external'}, "
        f"shared_buffers {server.get('settings', {}).get('shared_buffers', '?')}); Python {machine.get('python')}. "
        f"Took {results.get('seconds', 0):.0f} s.",
    ]
    sections = results["benchmarks"]
    if "claim" in sections:
        lines += ["", *claim_table(sections["claim"])]
        retained = retention_lines(sections["claim"])
        if retained:
            lines += ["", "Retention after the UPDATE-made history (everything but the 1,000 pending rows "
                      "dispatched or failed 31 days before the run):", "", *retained]
    if "mechanics" in sections:
        lines += ["", *mechanics_table(sections["mechanics"])]
        if sections["mechanics"].get("formula"):
            lines += ["", *formula_table(sections["mechanics"]["formula"])]
    if "fullpath" in sections:
        # the mechanics benchmark's batch-20 runs when it ran, else fullpath's own beside it
        mech = sections.get("mechanics") or {"runs": sections["fullpath"].get("mechanics") or []}
        lines += ["", *full_table(sections["fullpath"], mech)]
    if "http" in sections:
        for http in sections["http"].values():
            lines += ["", *http_table(http)]
            if "batch" in http:
                lines += ["", *batch_table(http["batch"])]
    if "shutdown" in sections:
        lines += ["", *shutdown_table(sections["shutdown"])]
    if "memory" in sections:
        lines += ["", *memory_table(sections["memory"])]
    if "profile" in sections:
        lines += ["", *profile_table(sections["profile"])]
    if "burst" in sections:
        lines += ["", *burst_table(sections["burst"])]
    if "console" in sections:
        from bench.console import table as console_table

        lines += ["", *console_table(sections["console"])]
    if "history" in sections:
        lines += ["", *history_table(sections["history"])]
    if "inbox" in sections:
        lines += ["", *inbox_table(sections["inbox"])]
    if "scale" in sections:
        from bench.scale import table as scale_table

        lines += ["", *scale_table(sections["scale"])]
    if "delivery" in sections:
        from bench.delivery import table as delivery_table

        lines += ["", *delivery_table(sections["delivery"])]
    errors = results.get("errors") or {}
    for name, message in errors.items():
        lines += ["", f"**{name} failed**: {message}"]
    return "\n".join(lines) + "\n"


def write(results: dict[str, Any], directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    stem = results["started"].replace(":", "").replace("-", "")
    json_path = directory / f"{stem}.json"
    md_path = directory / f"{stem}.md"
    json_path.write_text(json.dumps(results, indent=2, default=str))
    md_path.write_text(markdown(results))
    if "scale" in results["benchmarks"]:
        from bench.scale import plans_markdown

        (directory / f"{stem}-plans.md").write_text(plans_markdown(results["benchmarks"]["scale"]))
    return json_path, md_path
