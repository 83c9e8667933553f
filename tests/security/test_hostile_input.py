"""PARAM-1 to PARAM-6: whatever a stranger puts in a query string or a header, no route answers 5xx.

Every route of the app (the API, the inbox, the console) is attacked through every query
parameter it declares, an undeclared one, and the headers the app reads, class of input by
class of input: non-ASCII digits, signs, whitespace, huge numbers, NUL and control
characters, overlong strings, invalid percent-encoding, repeated parameters. Requests go
straight to ASGI as raw bytes (tests/security/hostile.py), so no client tidies them first.
A number-shaped parameter refuses every non-number with a 422 naming it; text accepts
what the database can store and refuses the rest the same way; nothing is a 5xx.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.service import SchedulerService
from scheduler.web.api.openapi import openapi_document
from scheduler.web.http.params import Param, digits_value, parse_query, whole_number
from scheduler.web.http.params import Unprocessable as Refused
from tests.helpers import event_body
from tests.security.hostile import Answer, Target, batch_bodies, call, targets

NON_ASCII_DIGITS = ["²", "٣", "\uff11", "\U0001d7d9", "Ⅻ", "߁", "᠑"]  # superscript, Arabic-Indic, full-width, math, ...
SIGNS = ["+1", "-1", "-0", "+0", "1-", "1e3", "0x10", "1_000", "1.0"]
WHITESPACE = [" 1", "1 ", "\t1", "1\n", "\u00a01", "1\u2003", "\u30001"]
HUGE = ["9" * 19, "1" + "0" * 30, "9" * 5000, str(2**64)]
CONTROL = ["\x00", "a\x00b", "\x01", "\x1b[31m", "\x7f", "\r\n", "\u2028"]
OVERLONG = ["x" * 10_000, "é" * 5_000]
BAD_PERCENT = [b"%", b"%z", b"%zz", b"%C3", b"%FF", b"%ED%A0%80", b"%C0%AF", b"a%2", b"%%41"]
NUMERIC_CLASSES = NON_ASCII_DIGITS + SIGNS + WHITESPACE + HUGE


def _encoded(value: str) -> bytes:
    return quote(value, safe="").encode()


def _numeric(param: Param) -> bool:
    """A parameter whose every non-number value is refused: integers and fixed choices."""
    return param.schema.get("type") == "integer" or "enum" in param.schema


def _no_5xx(target: Target, answer: Answer, sent: object) -> None:
    assert answer.error is None, f"{target.label} {sent!r}: {answer.error!r}"
    if answer.status == 503 and target.template in ("/health/scheduler", "/admin/health/scheduler"):
        return  # documented: no loop runs in this test's service (it is stepped by hand)
    assert answer.status < 500, f"{target.label} {sent!r}: {answer.status} {answer.text[:300]}"
    if 400 <= answer.status < 500 and not target.is_console:
        assert answer.headers.get("content-type", "").startswith("application/json"), (target.label, answer.text[:200])
        assert json.loads(answer.body).get("detail"), (target.label, answer.text[:200])


def _refused(target: Target, answer: Answer, field: str, sent: object) -> None:
    """A 422 naming ``field``: the project's JSON error shape, or the console's error page."""
    _no_5xx(target, answer, sent)
    assert answer.status == 422, f"{target.label} {field}={sent!r}: {answer.status} {answer.text[:300]}"
    if target.is_console:
        assert answer.headers["content-type"].startswith("text/html")
        assert f"{field}:" in answer.text.replace("&#39;", "'"), answer.text[:500]
    else:
        body = json.loads(answer.body)
        assert field in [e["field"] for e in body["errors"]], body
        assert set(body) == {"detail", "errors"}


def _every_parameter(service: SchedulerService) -> list[tuple[Target, str, Param]]:
    found = [(t, name, p) for t in targets(service.app.routes) for name, p in t.params.items()]
    assert len(found) >= 25, found  # the API's, the inbox's and the console's parameters
    return found


def console_session(service: SchedulerService) -> str:
    """An open console session of ``service`` (stored as a sign-in stores it), one per service."""
    found: str | None = getattr(service, "_hostile_console_session", None)
    if found is None:
        found = service.web_sessions.create("operator-ann", "admin", token_seconds_left=3600).secret
        setattr(service, "_hostile_console_session", found)  # noqa: B010 - a test's note on the service
    return found


def _send(service: SchedulerService, target: Target, query: bytes,
          extra: list[tuple[bytes, bytes]] | None = None) -> Answer:
    return call(service.app, target.method, target.path, query,
                [*target.credentials(console_session(service)), *(extra or [])])


@pytest.mark.clause("PARAM-1")
def test_every_route_declares_its_query_parameters_and_the_schema_shows_them(service: SchedulerService) -> None:
    """PARAM-1: each route carries its declaration; /openapi.json documents exactly the API's."""
    listed = list(targets(service.app.routes))  # fails naming a route without @declares
    document = openapi_document(service.app.routes)
    documented = 0
    for target in listed:
        operation = document["paths"].get(target.template, {}).get(target.method.lower())
        if operation is None:
            assert target.is_console or target.template == "/openapi.json", target.label
            continue
        documented += 1
        in_schema = {p["name"]: p["schema"] for p in operation.get("parameters", []) if p["in"] == "query"}
        assert in_schema == {name: param.schema for name, param in target.params.items()}, target.label
    assert documented == 31  # every API operation (the console's pages are not API operations)
    assert {"limit", "before_id"} <= {n for t in listed if t.template == "/admin/audit" for n in t.params}


def _refused_by_every_number(service: SchedulerService, value: str) -> None:
    """``value`` sent to every parameter: a 422 naming it where the parameter is a number,
    and no 5xx anywhere else."""
    for target, name, param in _every_parameter(service):
        answer = _send(service, target, f"{name}=".encode() + _encoded(value))
        if _numeric(param):
            _refused(target, answer, name, value)
        else:
            _no_5xx(target, answer, value)


@pytest.mark.clause("PARAM-2")
@pytest.mark.parametrize("value", NON_ASCII_DIGITS, ids=ascii)
def test_non_ascii_digits_are_a_422_naming_the_field_on_every_number(service: SchedulerService, value: str) -> None:
    """PARAM-2: '²' passes str.isdigit() and fails int(): every number-shaped parameter refuses it (422)."""
    _refused_by_every_number(service, value)


@pytest.mark.clause("PARAM-2")
@pytest.mark.parametrize("value", SIGNS, ids=ascii)
def test_signs_exponents_and_separators_are_a_422_on_every_number(service: SchedulerService, value: str) -> None:
    """PARAM-2: a number is ASCII digits and nothing else: no sign, exponent, base prefix or separator."""
    _refused_by_every_number(service, value)


@pytest.mark.clause("PARAM-2")
@pytest.mark.parametrize("value", WHITESPACE, ids=ascii)
def test_whitespace_around_a_number_is_a_422(service: SchedulerService, value: str) -> None:
    """PARAM-2: ' 1', '1\\n', a no-break space: refused, not stripped, on every number."""
    _refused_by_every_number(service, value)


@pytest.mark.clause("PARAM-2")
@pytest.mark.parametrize("value", HUGE, ids=lambda v: f"{len(v)}-digits")
def test_huge_numbers_are_a_422_not_an_overflow(service: SchedulerService, value: str) -> None:
    """PARAM-2: past the field's bound (and past bigint, past Python's int-parsing limit): a 422."""
    for target, name, param in _every_parameter(service):
        answer = _send(service, target, f"{name}={value}".encode())
        if _numeric(param) or len(value) > 4000:
            _refused(target, answer, name, value[:30])
        else:
            _no_5xx(target, answer, value[:30])


@pytest.mark.clause("PARAM-3")
@pytest.mark.parametrize("value", CONTROL, ids=ascii)
def test_nul_is_a_422_everywhere_and_control_characters_never_a_5xx(service: SchedulerService, value: str) -> None:
    """PARAM-3: NUL cannot be stored or compared: a 422 naming the field; other controls are text or refused."""
    for target, name, param in _every_parameter(service):
        answer = _send(service, target, f"{name}=".encode() + _encoded(value))
        if "\x00" in value or _numeric(param):
            _refused(target, answer, name, value)
        else:
            _no_5xx(target, answer, value)


@pytest.mark.clause("PARAM-3")
@pytest.mark.parametrize("value", OVERLONG, ids=lambda v: f"{len(v)}-chars")
def test_overlong_values_are_a_422_naming_the_field(service: SchedulerService, value: str) -> None:
    """PARAM-3: every parameter is bounded (text 200 characters, a sign-in target 4000)."""
    for target, name, _ in _every_parameter(service):
        _refused(target, _send(service, target, f"{name}=".encode() + _encoded(value)), name, value[:20])


@pytest.mark.clause("PARAM-4")
@pytest.mark.parametrize("raw", BAD_PERCENT, ids=ascii)
def test_invalid_percent_encoding_is_a_422_naming_the_field(service: SchedulerService, raw: bytes) -> None:
    """PARAM-4: '%zz', a lone '%', bytes that are not UTF-8 (a lone lead byte, a surrogate, an overlong form)."""
    for target, name, _ in _every_parameter(service):
        _refused(target, _send(service, target, f"{name}=".encode() + raw), name, raw)


@pytest.mark.clause("PARAM-5")
@pytest.mark.clause("DEC-PARAMS")
def test_a_repeated_parameter_is_a_422_even_with_two_good_values(service: SchedulerService) -> None:
    """PARAM-5: which of two values counts differs between proxies and frameworks: refused."""
    for target, name, param in _every_parameter(service):
        good = {"integer": "1"}.get(param.schema.get("type", ""), "x")
        if "enum" in param.schema:
            good = param.schema["enum"][0]
        if param.schema.get("format") == "date-time":
            good = "2026-11-30T09:00:00+00:00"
        answer = _send(service, target, f"{name}={good}&{name}={good}".encode())
        _refused(target, answer, name, good)


@pytest.mark.clause("PARAM-5")
@pytest.mark.clause("DEC-PARAMS")
def test_an_unknown_parameter_is_a_422_on_every_route(service: SchedulerService) -> None:
    """PARAM-5: a misspelt filter (?stauts=failed) must not widen a selection: refused, naming it."""
    for target in targets(service.app.routes):
        answer = _send(service, target, b"stauts=failed")
        _refused(target, answer, "stauts", "stauts")
        _no_5xx(target, _send(service, target, b"%00=1&" + _encoded("é" * 300) + b"=2"), "unprintable names")


@pytest.mark.clause("PARAM-5")
def test_an_empty_value_is_the_same_as_no_value(service: SchedulerService) -> None:
    """PARAM-5: an HTML form sends its empty fields: ?limit=&status= lists with the defaults."""
    target = next(t for t in targets(service.app.routes) if t.label == "GET /admin/scheduled-events")
    answer = _send(service, target, b"limit=&status=&user_id=")
    assert answer.status == 200, answer.text


@pytest.mark.clause("PARAM-2")
def test_the_reported_superscript_two_is_a_422_on_the_three_admin_lists(service: SchedulerService) -> None:
    """PARAM-2: the three inputs that were 500s: ?limit=%C2%B2 and ?before_id=%C2%B2."""
    by_label = {t.label: t for t in targets(service.app.routes)}
    for label, name in [("GET /admin/scheduled-events", "limit"), ("GET /admin/audit", "before_id"),
                        ("GET /admin/notifications", "limit"), ("GET /console/audit", "before_id"),
                        ("GET /me/notifications", "limit")]:
        _refused(by_label[label], _send(service, by_label[label], f"{name}=%C2%B2".encode()), name, "²")


HOSTILE_HEADER_VALUES = [v.encode() for v in NON_ASCII_DIGITS + SIGNS + WHITESPACE + HUGE + CONTROL] + [
    b"\xff\xfe", b"\xc3", b"x" * 10_000, b"%C2%B2", b""]


@pytest.mark.clause("PARAM-6")
@pytest.mark.parametrize("value", HOSTILE_HEADER_VALUES, ids=lambda v: ascii(v[:12]))
def test_a_hostile_last_event_id_is_a_422_naming_the_header(service: SchedulerService, value: bytes) -> None:
    """PARAM-6: the inbox stream's Last-Event-ID is a stream number, parsed as strictly as ?after=."""
    target = next(t for t in targets(service.app.routes) if t.label == "GET /me/notifications/stream")
    if value == b"":
        return  # an empty header is no header: the stream would open (proved in test_inbox.py)
    answer = _send(service, target, target.finite, [(b"last-event-id", value)])
    _refused(target, answer, "Last-Event-ID", value[:20])


@pytest.mark.clause("PARAM-6")
def test_hostile_authorization_cookie_host_and_content_length_headers_are_never_a_5xx(
    service: SchedulerService,
) -> None:
    """PARAM-6: every header the app reads, on every route, with every class of hostile value."""
    for target in targets(service.app.routes):
        for value in [*HOSTILE_HEADER_VALUES[::3], b"Bearer \x00", b"Bearer " + b"a" * 10_000, b"Bearer a.b.c"]:
            for header in (b"authorization", b"cookie", b"host", b"content-length"):
                credentials = [] if header == b"authorization" else target.credentials(console_session(service))
                answer = call(service.app, target.method, target.path, target.finite,
                              [*credentials, (header, value)])
                if target.is_console and answer.status in (303, 401, 403):
                    continue
                _no_5xx(target, answer, (header, value[:20]))
                if header == b"authorization" and value:
                    assert answer.status == 401, (target.label, value[:20], answer.status)


# -- the primitives themselves, and a property-based fuzz over every route -----------


@pytest.mark.clause("PARAM-2")
@given(st.text(max_size=40))
def test_a_whole_number_is_exactly_a_short_run_of_ascii_digits(raw: str) -> None:
    """PARAM-2: whole_number accepts exactly what int() reads from ASCII digits within bounds."""
    ascii_number = raw.isascii() and raw.isdigit() and len(raw) <= 4
    try:
        value = whole_number("n", raw, low=1, high=1000)
    except Refused as exc:
        assert exc.errors == [{"field": "n", "message": "must be a whole number from 1 to 1000 (ASCII digits only)"}]
        assert not (ascii_number and 1 <= int(raw) <= 1000)
    else:
        assert ascii_number and value == int(raw) and 1 <= value <= 1000
    assert digits_value(raw, 18) in (None, *([int(raw)] if raw.isascii() and raw.isdigit() else []))


QUERY_BYTES = st.one_of(
    st.binary(max_size=60),
    st.text(max_size=40).map(lambda s: quote(s, safe="=&").encode()),
    st.lists(st.tuples(st.sampled_from(["limit", "before_id", "after", "status", "user_id", "before", "once", "x"]),
                       st.sampled_from(NUMERIC_CLASSES + CONTROL + ["1", "", "é" * 250])), max_size=4)
    .map(lambda pairs: "&".join(f"{k}={quote(v, safe='')}" for k, v in pairs).encode()),
)


@pytest.mark.clause("PARAM-1")
@settings(max_examples=int(__import__("os").environ.get("SCHEDULER_FUZZ_EXAMPLES", "25")) * 12, deadline=None,
          database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzing_every_route_with_raw_query_strings_and_headers_finds_no_5xx(
    service: SchedulerService, data: st.DataObject
) -> None:
    """PARAM-1: Hypothesis draws a route, a raw query string and hostile headers: never a 5xx."""
    everything = list(targets(service.app.routes))
    target = data.draw(st.sampled_from(everything), label="route")
    raw = data.draw(QUERY_BYTES, label="query")
    headers = data.draw(st.lists(st.tuples(st.sampled_from([b"last-event-id", b"authorization", b"cookie"]),
                                           st.binary(max_size=40)), max_size=2), label="headers")
    if target.finite:
        raw += b"&" + target.finite  # a valid query would open a stream that never ends
    credentials = [] if any(h == b"authorization" for h, _ in headers) else target.credentials(console_session(service))
    answer = call(service.app, target.method, target.path, raw, [*credentials, *headers])
    if target.is_console and answer.status in (303, 401, 403):
        return
    _no_5xx(target, answer, (raw, headers))
    try:
        parse_query(raw, target.params)
    except Refused:
        assert answer.status in (401, 403, 422), (target.label, raw, answer.status)


@pytest.mark.clause("BATCH-1")
@pytest.mark.clause("BATCH-2")
def test_the_batch_route_answers_every_hostile_body_without_a_5xx(service: SchedulerService) -> None:
    """BATCH-1, BATCH-2: an empty array, a non-array, items of every wrong shape, 10,001 items
    and one huge item, sent as raw bytes: never a 5xx; every refusal JSON with a detail; an
    array within the bounds answers one result per item, each a 201 or a 422 with a detail."""
    target = Target("POST", "/admin/scheduled-events/bulk", "ingest", "/admin/scheduled-events/bulk", {})
    for label, body, expected in batch_bodies(event_body()):
        answer = call(service.app, "POST", target.path, b"",
                      [*target.credentials(""), (b"content-type", b"application/json")], body)
        _no_5xx(target, answer, label)
        assert answer.status == expected, f"{label}: {answer.status} {answer.text[:300]}"
        if expected == 200:
            results = json.loads(answer.body)
            sent = json.loads(body)
            assert [r["index"] for r in results] == list(range(len(sent))), label
            assert all(r["status"] == 201 or r["error"]["detail"] for r in results), label
