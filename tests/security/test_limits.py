"""SEC-10 to SEC-14: hostile and malformed input is a clear 4xx, never a 500, and stores nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from scheduler.web.http.bodies import MAX_DEPTH
from scheduler.web.http.params import MAX_STRING
from tests.conftest import ADMIN, INGEST, T0, TEST_SECRET

SCHEDULED = "/admin/scheduled-events"


@pytest.fixture
def safe_client(service: SchedulerService) -> Iterator[TestClient]:
    """A client that turns a server error into a 500 response instead of raising it."""
    with TestClient(service.app, raise_server_exceptions=False) as client:
        yield client


def facts(**extra: Any) -> dict[str, Any]:
    return {"facts_version": "1", "scenario": "commitment_reminder", "date": "2026-11-30",
            "commitment": "run the dishwasher at noon", **extra}


def body(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"event_type": "commitment_reminder", "user_id": "participant-1",
                            "trigger_at": T0.isoformat(), "facts": facts()}
    base.update(fields)
    return base


def stored_ids(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return sorted(conn.execute(text("SELECT id FROM scheduled_events")).scalars())


def refused(response: Any, status: int, *words: str) -> str:
    """Assert a JSON error with ``status`` whose detail names the problem."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    detail = json.dumps(response.json()["detail"])
    for word in words:
        assert word in detail, (word, detail)
    return detail


@pytest.mark.clause("SEC-10")
def test_a_body_over_the_limit_is_413_whether_declared_or_streamed(
    safe_client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """SEC-10: over SCHEDULER_MAX_BODY_BYTES (64 KiB by default) is a 413 naming the limit, read or not."""
    limit = service.settings.max_body_bytes
    big = json.dumps(body(facts=facts(padding="x" * limit))).encode()
    refused(safe_client.post(SCHEDULED, headers=INGEST, content=big), 413, f"larger than {limit} bytes")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is counted while streaming
        for start in range(0, len(big), 4096):
            yield big[start:start + 4096]

    refused(safe_client.post(SCHEDULED, headers=INGEST, content=chunks()), 413, f"larger than {limit} bytes")
    refused(safe_client.post("/admin/ingest-event", headers=INGEST, content=big), 413)
    refused(safe_client.put("/admin/participants/p/preferences", headers=ADMIN, content=big), 413)
    assert stored_ids(engine) == []


@pytest.mark.clause("SEC-10")
def test_the_body_limit_is_configurable(engine: Engine, clock: ManualClock) -> None:
    """SEC-10: SCHEDULER_MAX_BODY_BYTES=2048 refuses a 3 KB body that the default would take."""
    service = SchedulerService(Settings(jwt_secret=TEST_SECRET, max_body_bytes=2048), engine=engine, clock=clock,
                               run_scheduler=False)
    payload = body(facts=facts(note="n" * 3000))
    with TestClient(service.app) as client:
        refused(client.post(SCHEDULED, headers=INGEST, json=payload), 413, "larger than 2048 bytes")


@pytest.mark.clause("SEC-11")
def test_nesting_beyond_the_limit_is_422_at_every_depth(safe_client: TestClient, engine: Engine) -> None:
    """SEC-11: facts nested deeper than MAX_DEPTH, and bodies too deep for the JSON parser, are 422."""
    nested: Any = "leaf"
    for _ in range(MAX_DEPTH + 1):
        nested = {"n": nested}
    refused(safe_client.post(SCHEDULED, headers=INGEST, json=body(facts=facts(deep=nested))), 422,
            "facts", f"nested deeper than {MAX_DEPTH} levels")
    refused(safe_client.post(SCHEDULED, headers=INGEST, content=b"[" * 30000 + b"]" * 30000), 422, "nested too deeply")
    refused(safe_client.post("/admin/ingest-event", headers=INGEST, content=b'{"a":' * 9000 + b"1" + b"}" * 9000),
            422, "nested too deeply")
    shallow: Any = "leaf"
    for _ in range(MAX_DEPTH // 2 - 1):
        shallow = [shallow]
    assert safe_client.post(SCHEDULED, headers=INGEST, json=body(facts=facts(ok=shallow))).status_code == 201
    assert len(stored_ids(engine)) == 1


@pytest.mark.clause("SEC-12")
@pytest.mark.parametrize("field", ["event_type", "user_id", "community_id", "external_key"])
def test_strings_longer_than_the_limit_are_422_naming_the_field(
    safe_client: TestClient, engine: Engine, field: str
) -> None:
    """SEC-12: MAX_STRING (200) characters are stored; one more is a 422 naming the field."""
    at_limit = safe_client.post(SCHEDULED, headers=INGEST, json=body(**{field: "k" * MAX_STRING}))
    assert at_limit.status_code == 201, at_limit.text
    refused(safe_client.post(SCHEDULED, headers=INGEST, json=body(**{field: "k" * (MAX_STRING + 1)})), 422, field)
    assert stored_ids(engine) == [at_limit.json()["id"]]


@pytest.mark.clause("SEC-12")
@pytest.mark.clause("SEC-14")
@pytest.mark.parametrize(
    ("method", "path", "name"),
    [
        ("GET", "/admin/scheduled-events/{}", "event_id"),
        ("POST", "/admin/scheduled-events/{}/reset", "event_id"),
        ("PUT", "/admin/participants/{}/preferences", "user_id"),
        ("GET", "/admin/scheduled-events?user_id={}", "user_id"),
        ("GET", "/admin/notifications?user_id={}", "user_id"),
    ],
)
def test_ids_in_paths_and_queries_are_bounded_and_nul_free(
    safe_client: TestClient, method: str, path: str, name: str
) -> None:
    """SEC-12, SEC-14: an over-long id or one with a NUL byte is a 422 naming the parameter."""
    kwargs: dict[str, Any] = {"json": {"max_per_day": 2}} if method == "PUT" else {}
    refused(safe_client.request(method, path.format("i" * (MAX_STRING + 1)), headers=ADMIN, **kwargs), 422, name,
            f"at most {MAX_STRING} characters")
    refused(safe_client.request(method, path.format("a%00b"), headers=ADMIN, **kwargs), 422, name, "NUL")


@pytest.mark.clause("SEC-13")
@pytest.mark.parametrize("value", [[], ["facts_version", "scenario"], "facts", 7, True])
@pytest.mark.parametrize("route", [SCHEDULED, "/admin/ingest-event"])
def test_facts_that_are_not_an_object_are_422_naming_facts(
    safe_client: TestClient, engine: Engine, value: Any, route: str
) -> None:
    """SEC-13: facts must be a JSON object."""
    payload = body(facts=value)
    if route != SCHEDULED:
        payload.pop("trigger_at")
    refused(safe_client.post(route, headers=INGEST, json=payload), 422, "facts")
    assert stored_ids(engine) == []


@pytest.mark.clause("SEC-13")
@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b"{", b"\xff\xfe\x00", b'{"facts": NaN}', b'{"x": -Infinity}', b'{"x": 1' + b"0" * 5000 + b"}",
     b"[1, 2]", b'"just a string"', b"null"],
)
def test_a_body_that_is_not_a_json_object_is_422(safe_client: TestClient, engine: Engine, raw: bytes) -> None:
    """SEC-13: invalid JSON, NaN/Infinity (jsonb refuses them), absurd integers and non-objects are 422."""
    refused(safe_client.post(SCHEDULED, headers=INGEST, content=raw), 422)
    assert stored_ids(engine) == []


@pytest.mark.clause("SEC-13")
@pytest.mark.parametrize("trigger_at", ["9999-12-31T23:59:59-12:00", "0001-01-01T00:00:00+14:00", "2026-11-30T09:00:00",
                                        "tomorrow", "2026-13-01T00:00:00Z", None])
def test_a_trigger_time_that_cannot_be_stored_is_422(safe_client: TestClient, trigger_at: Any) -> None:
    """SEC-13: a naive time, a time out of range once converted to UTC, or not a time at all is 422."""
    refused(safe_client.post(SCHEDULED, headers=INGEST, json=body(trigger_at=trigger_at)), 422, "trigger_at")


NUL_CASES: list[tuple[str, dict[str, Any]]] = [
    ("user_id", body(user_id="a\u0000b")),
    ("event_type", body(event_type="\u0000")),
    ("community_id", body(community_id="c\u0000")),
    ("external_key", body(external_key="k\u0000")),
    ("facts", body(facts=facts(commitment="dishes\u0000"))),
    ("facts", body(facts={**facts(), "key\u0000": 1})),
    ("facts", body(facts=facts(nested={"list": ["ok", "bad\u0000"]}))),
]
SURROGATE_BODIES = [
    ("facts", b'{"event_type":"t","user_id":"u","trigger_at":"2026-11-30T09:00:00+00:00",'
              b'"facts":{"facts_version":"1","scenario":"s","x":"\\ud800"}}'),
    ("facts", b'{"event_type":"t","user_id":"u","trigger_at":"2026-11-30T09:00:00+00:00",'
              b'"facts":{"facts_version":"1","scenario":"s","\\udfff":"key"}}'),
    ("user_id", b'{"event_type":"t","user_id":"\\ud83d","trigger_at":"2026-11-30T09:00:00+00:00",'
                b'"facts":{"facts_version":"1","scenario":"s"}}'),
]


@pytest.mark.clause("SEC-14")
@pytest.mark.parametrize(("field", "payload"), NUL_CASES, ids=[f"{f}-{i}" for i, (f, _) in enumerate(NUL_CASES)])
def test_nul_bytes_anywhere_in_the_body_are_422_not_500(
    safe_client: TestClient, engine: Engine, field: str, payload: dict[str, Any]
) -> None:
    """SEC-14: PostgreSQL refuses \\u0000 in text and jsonb: the sender gets a 422 naming the field."""
    refused(safe_client.post(SCHEDULED, headers=INGEST, json=payload), 422, field, "NUL")
    if field != "external_key":  # the live route has no external_key
        live = {k: v for k, v in payload.items() if k in {"event_type", "user_id", "community_id", "facts"}}
        refused(safe_client.post("/admin/ingest-event", headers=INGEST, json=live), 422, field, "NUL")
    assert stored_ids(engine) == []


@pytest.mark.clause("SEC-14")
@pytest.mark.parametrize(("field", "raw"), SURROGATE_BODIES)
def test_unpaired_surrogates_are_422_not_500(safe_client: TestClient, engine: Engine, field: str, raw: bytes) -> None:
    """SEC-14: JSON can spell an unpaired surrogate (\\ud800) that no UTF-8 database can store: 422."""
    refused(safe_client.post(SCHEDULED, headers=INGEST, content=raw), 422, field)
    assert stored_ids(engine) == []


@pytest.mark.clause("SEC-14")
def test_preference_kinds_are_bounded_and_nul_free(safe_client: TestClient) -> None:
    """SEC-14: enabled_kinds entries are text the database can store, and not too many."""
    path = "/admin/participants/p1/preferences"
    refused(safe_client.put(path, headers=ADMIN, json={"enabled_kinds": ["reminder\u0000"]}), 422,
            "enabled_kinds", "NUL")
    refused(safe_client.put(path, headers=ADMIN, json={"enabled_kinds": ["r" * 201]}), 422, "enabled_kinds")
    refused(safe_client.put(path, headers=ADMIN, json={"enabled_kinds": [f"k{i}" for i in range(101)]}), 422,
            "enabled_kinds")
    assert safe_client.put(path, headers=ADMIN, json={"enabled_kinds": ["reminder"]}).status_code == 200


@pytest.mark.clause("SEC-14")
def test_real_unicode_is_stored_and_returned_intact(safe_client: TestClient, engine: Engine) -> None:
    """SEC-14: emoji, right-to-left text, combining marks and astral characters are data, kept as sent."""
    samples = {"emoji": "🔋⚡️👩🏽‍🔧", "rtl": "مرحبا بالعالم", "combining": "e\u0301\u0308", "cjk": "節電",
               "astral": "\U0001d11e", "bidi": "\u202eabc", "zero_width": "a\u200bb"}
    payload = body(user_id="user-🔋-節電", community_id="coop-é", external_key="key-\U0001d11e",
                   facts=facts(**samples))
    created = safe_client.post(SCHEDULED, headers=INGEST, json=payload)
    assert created.status_code == 201, created.text
    row = safe_client.get(f"{SCHEDULED}/{created.json()['id']}", headers=ADMIN).json()
    assert (row["user_id"], row["community_id"], row["external_key"]) == ("user-🔋-節電", "coop-é", "key-\U0001d11e")
    assert {k: row["facts"][k] for k in samples} == samples
    assert stored_ids(engine) == [created.json()["id"]]
