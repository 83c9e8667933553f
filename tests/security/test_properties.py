"""SEC-16: property tests for the facts contract and the time-scope parser.

Arbitrary JSON never crashes them (they return or raise their own documented error), and
they accept exactly the documented shapes. The oracles below are written from the
documentation (specs/dispatch-path.md, CTX-FACTS.1 and CTX-TIME.1 to 3), not from the
implementation's regular expressions.
"""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduler.nudging.facts import (
    TIME_FIELDS,
    ContractViolation,
    FactsMissing,
    TimeScope,
    TimeScopeError,
    check_facts_contract,
    parse_time_scope,
)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)

# Strings near the documented shapes: \d here also draws non-ASCII digits, and the
# whitespace around them must be trimmed.
near_shapes = st.from_regex(r"\A\s{0,2}\d{4}(-\d{2}(-\d{2})?|-W\d{2})?\s{0,2}\Z")
real_shapes = st.one_of(
    st.dates().map(date.isoformat),
    st.dates().map(lambda d: f"{d.isocalendar().year:04d}-W{d.isocalendar().week:02d}"),
    st.dates().map(lambda d: f"{d.year:04d}-{d.month:02d}"),
    st.integers(0, 9999).map(lambda y: f"{y:04d}"),
)
time_values = st.one_of(st.none(), st.text(max_size=12), near_shapes, real_shapes, json_values)
short_strings = st.one_of(st.text(max_size=6), st.sampled_from(["", " ", "\t", "1", "1.0", "commitment_reminder"]))


def _digits(text: str) -> bool:
    return text != "" and all(c in "0123456789" for c in text)


def documented_scope(text: str) -> TimeScope | None:
    """CTX-TIME.1 from its words: YYYY-MM-DD (a real date), YYYY-Www (a real ISO week), YYYY-MM, YYYY."""
    s = text.strip()
    if len(s) == 10 and s[4] == "-" and s[7] == "-" and _digits(s[:4] + s[5:7] + s[8:]):
        try:
            date(int(s[:4]), int(s[5:7]), int(s[8:]))
        except ValueError:
            return None
        return TimeScope("daily", s)
    if len(s) == 8 and s[4:6] == "-W" and _digits(s[:4] + s[6:]):
        try:
            date.fromisocalendar(int(s[:4]), int(s[6:]), 1)
        except ValueError:
            return None
        return TimeScope("weekly", s)
    if len(s) == 7 and s[4] == "-" and _digits(s[:4] + s[5:]):
        return TimeScope("monthly", s) if 1 <= int(s[5:]) <= 12 else None
    if len(s) == 4 and _digits(s):
        return TimeScope("yearly", s)
    return None


def expected_scope(facts: dict[str, Any]) -> TimeScope | None:
    """CTX-TIME.2: the first non-empty of time, date, week, period decides; a non-string refuses."""
    for name in TIME_FIELDS:
        raw = facts.get(name)
        if raw is None:
            continue
        if not isinstance(raw, str):
            return None
        if not raw.strip():
            continue
        return documented_scope(raw)
    return None


def expected_contract_errors(facts: Any) -> str | list[str]:
    """CTX-FACTS.1: 'missing', or the list of offending fields ([] when it holds)."""
    if facts is None or facts == {}:
        return "missing"
    if not isinstance(facts, dict):
        return ["facts"]
    return [
        f"facts.{name}"
        for name in ("facts_version", "scenario")
        if not (isinstance(facts.get(name), str) and facts[name].strip())
    ]


@pytest.mark.clause("SEC-16")
@SETTINGS
@given(facts=st.one_of(json_values, st.fixed_dictionaries(
    {}, optional={"facts_version": st.one_of(short_strings, json_values),
                  "scenario": st.one_of(short_strings, json_values),
                  "other": json_values})))
@example(facts=[])
@example(facts="")
@example(facts={"facts_version": "1", "scenario": "\u3000"})
def test_the_facts_contract_never_crashes_and_accepts_exactly_the_documented_shape(facts: Any) -> None:
    """SEC-16: any JSON value is accepted, or refused as missing, or refused naming the bad fields."""
    expected = expected_contract_errors(facts)
    try:
        returned = check_facts_contract(facts)
    except FactsMissing:
        assert expected == "missing"
    except ContractViolation as violation:
        assert [e["field"] for e in violation.errors] == expected
        assert all(e["message"] for e in violation.errors)
    else:
        assert expected == [] and returned is facts


@pytest.mark.clause("SEC-16")
@SETTINGS
@given(
    facts=st.fixed_dictionaries({}, optional={name: time_values for name in TIME_FIELDS})
    | st.dictionaries(st.text(max_size=8), json_values, max_size=5)
)
@example(facts={"date": "\uff12\uff10\uff12\uff16-11-30"})  # fullwidth digits
@example(facts={"date": "\u0662\u0660\u0662\u0666"})  # Arabic-Indic digits
@example(facts={"time": " ", "date": "2026-W53"})
@example(facts={"period": "2026-02-29"})
def test_the_time_scope_parser_never_crashes_and_accepts_exactly_the_documented_shapes(facts: dict[str, Any]) -> None:
    """SEC-16: a TimeScope exactly when the documentation says so; otherwise TimeScopeError."""
    expected = expected_scope(facts)
    try:
        scope = parse_time_scope(facts)
    except TimeScopeError as refusal:
        assert expected is None, f"refused a documented shape: {refusal}"
        assert str(refusal).startswith("missing_or_invalid_time_scope")
    else:
        assert scope == expected


@pytest.mark.clause("SEC-16")
@SETTINGS
@given(scope=real_shapes, field=st.sampled_from(TIME_FIELDS), pad=st.sampled_from(["", " ", "\t", "\n "]))
def test_every_real_period_in_any_time_field_is_accepted_trimmed(scope: str, field: str, pad: str) -> None:
    """SEC-16: the generated real dates, ISO weeks, months and years all parse, trimmed, with their frequency."""
    parsed = parse_time_scope({field: f"{pad}{scope}{pad}"})
    assert parsed.value == scope
    assert parsed == documented_scope(scope)
