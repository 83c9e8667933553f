"""The spec report's content: every clause of specs/ with the tests that prove it and what
they came to in this run, as the plain data written to ``report.json``.

A clause is *proved* when every test it lists passed (every variant of a parametrized
test), *broken* when one failed, *unproven* when none failed but one was skipped, xfailed or
xpassed, and *not run* otherwise (a test it lists was not in this run's selection). Pages
and requirement groups take the same four states from their clauses: broken if one is,
else unproven if one is, else proved if all are, else not run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from harness.spec_report.outcomes import Outcome, Run, overall
from harness.spec_report.specs import KIND_ORDER, Clause, Kind, Specs

FORMAT = "scheduler-spec-report/1"
UNPROVEN = {Outcome.SKIPPED, Outcome.XFAILED, Outcome.XPASSED}
SHOWN_IDS = 6
SHOWN_REASON = 70


class State(StrEnum):
    PROVED = "proved"
    BROKEN = "broken"
    UNPROVEN = "unproven"
    NOT_RUN = "not_run"


def clause_state(outcomes: Iterable[Outcome]) -> State:
    """A clause's state from the outcomes of the tests it lists."""
    seen = list(outcomes)
    if Outcome.FAILED in seen:
        return State.BROKEN
    if UNPROVEN.intersection(seen):
        return State.UNPROVEN
    if seen and all(outcome is Outcome.PASSED for outcome in seen):
        return State.PROVED
    return State.NOT_RUN


def combined_state(states: Iterable[State]) -> State:
    """A page's or a group's state from its clauses' states."""
    seen = list(states)
    for state in (State.BROKEN, State.UNPROVEN):
        if state in seen:
            return state
    if seen and all(state is State.PROVED for state in seen):
        return State.PROVED
    return State.NOT_RUN


def counts(states: Iterable[State]) -> dict[str, int]:
    tally = dict.fromkeys((state.value for state in State), 0)
    for state in states:
        tally[state.value] += 1
    return tally


class DecisionIndex:
    """The decisions that refine a clause: named in its words, naming it, or proved by one of
    the tests that prove it (each decision's text is read once)."""

    def __init__(self, specs: Specs) -> None:
        self.specs = specs
        self.decisions = [(clause.id, set(specs.mentions(f"{clause.words}\n{clause.text}")), set(clause.tests))
                          for clause in specs.clauses.values() if clause.kind is Kind.DECISION]

    def of(self, clause: Clause) -> list[str]:
        specs = self.specs
        found = [cid for cid in specs.mentions(f"{clause.words}\n{clause.text}")
                 if specs.clauses[cid].kind is Kind.DECISION]
        tests = set(clause.tests)
        found += [dec for dec, named, proving in self.decisions if clause.id in named or tests & proving]
        return [cid for cid in dict.fromkeys(found) if cid != clause.id]


def _reason(outcome: Outcome, reason: str | None) -> str:
    text = " ".join((reason or "no reason given").split())
    if len(text) > SHOWN_REASON:
        text = text[: SHOWN_REASON - 1] + "…"
    return text if outcome is Outcome.SKIPPED else f"{outcome.value}: {text}"


def _ids(ids: list[str]) -> str:
    shown = ", ".join(ids[:SHOWN_IDS])
    return shown + (f" +{len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else "")


def summary_line(clauses: list[dict[str, Any]]) -> str:
    """``271 clauses: 269 proved, 2 unproven (Chromium missing: CON-3, CON-4)``, with the
    broken clauses named and the unproven ones grouped by reason."""
    tally = counts(State(clause["state"]) for clause in clauses)
    parts = [f"{tally['proved']} proved"]
    broken = [clause["id"] for clause in clauses if clause["state"] == State.BROKEN]
    if broken:
        parts.append(f"{len(broken)} broken ({_ids(broken)})")
    by_reason: dict[str, list[str]] = {}
    for clause in clauses:
        if clause["state"] == State.UNPROVEN:
            for reason in clause["reasons"]:
                by_reason.setdefault(reason, []).append(clause["id"])
    if by_reason:
        why = "; ".join(f"{reason}: {_ids(ids)}" for reason, ids in by_reason.items())
        parts.append(f"{tally['unproven']} unproven ({why})")
    if tally["not_run"]:
        parts.append(f"{tally['not_run']} not run")
    return f"{len(clauses)} clauses: " + ", ".join(parts)


def build_report(specs: Specs, runs: Mapping[str, list[Run]], marked: Mapping[str, set[str]],
                 run_info: Mapping[str, Any]) -> dict[str, Any]:
    """The report of one run.

    ``runs``: base node id -> its variants that ran; ``marked``: base node id -> the clauses
    its ``clause`` markers name (the tests this run collected). A clause's tests are those
    its page lists and those whose marker names it.
    """
    marking: dict[str, list[str]] = {}
    problems = list(specs.problems)
    for nodeid, cids in sorted(marked.items()):
        for cid in sorted(cids):
            if cid in specs.clauses:
                marking.setdefault(cid, []).append(nodeid)
            else:
                problems.append(f"{nodeid}: its clause marker names {cid}, which no page of specs/ defines")
    decisions = DecisionIndex(specs)
    ordered = sorted(specs.clauses.values(),
                     key=lambda clause: KIND_ORDER[clause.kind])  # stable: page order within a kind
    clauses: list[dict[str, Any]] = []
    for clause in ordered:
        tests: list[dict[str, Any]] = []
        outcomes: list[Outcome] = []
        reasons: list[str] = []
        for nodeid in dict.fromkeys(clause.tests + marking.get(clause.id, [])):
            variants = runs.get(nodeid, [])
            outcome = overall(variants)
            outcomes.append(outcome)
            tests.append({"nodeid": nodeid, "listed": nodeid in clause.tests, "outcome": outcome.value,
                          "duration_seconds": round(sum(run.duration for run in variants), 4),
                          "runs": [run.as_json() for run in variants]})
            reasons += [_reason(run.outcome, run.reason) for run in variants if run.outcome in UNPROVEN]
        state = clause_state(outcomes)
        clauses.append({"id": clause.id, "words": clause.words, "page": clause.page,
                        "line": clause.line, "kind": clause.kind.value, "requirement": clause.group,
                        "state": state.value, "reasons": list(dict.fromkeys(reasons)),
                        "decisions": decisions.of(clause), "tests": tests})
    by_id = {clause["id"]: clause for clause in clauses}
    groups = sorted(specs.groups.values(), key=lambda group: KIND_ORDER[specs.clauses[group.clauses[0]].kind])
    requirements = []
    for group in groups:
        states = [State(by_id[cid]["state"]) for cid in group.clauses]
        decided = specs.mentions(group.opening) + [dec for cid in group.clauses for dec in by_id[cid]["decisions"]]
        requirements.append({
            "key": group.key, "id": group.requirement, "title": group.title, "page": group.page,
            "kind": specs.clauses[group.clauses[0]].kind.value, "opening": group.opening,
            "state": combined_state(states).value, "counts": counts(states),
            "decisions": [cid for cid in dict.fromkeys(decided)
                          if specs.clauses[cid].kind is Kind.DECISION and cid not in group.clauses],
            "clauses": list(group.clauses),
        })
    pages = []
    for page in specs.pages:
        states = [State(clause["state"]) for clause in clauses if clause["page"] == page.name]
        pages.append({"page": page.name, "title": page.title, "state": combined_state(states).value,
                      "counts": counts(states)})
    return {
        "format": FORMAT,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "run": dict(run_info),
        "summary": {"clauses": len(clauses), **counts(State(c["state"]) for c in clauses),
                    "line": summary_line(clauses)},
        "pages": pages,
        "requirements": requirements,
        "clauses": clauses,
        "problems": problems,
    }
