"""JSON logs (``SCHEDULER_LOG_FORMAT=json``): one object a line, stable fields, no secrets.

In our words: each line is a JSON object with time, level, logger and message, plus the
event id, the replica and the trace id where they exist; neither format ever writes a
password of a connection string or a token; ``scheduler serve`` writes nothing else.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from reliability.cluster import ROOT, free_port, wait_for
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.config import ConfigError, Settings
from scheduler.core.clock import ManualClock
from scheduler.nudging.decision import NudgingPlatform
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.nudging.rules import load_catalogue
from scheduler.observability.logs import JsonFormatter, RedactingFormatter, redact
from scheduler.observability.otel import TracingObserver
from scheduler.service import SchedulerService
from tests.conftest import INGEST, T0, TEST_SECRET
from tests.helpers import FakeDispatcher, event_body, post_event
from tests.operations.support import loop_step

PASSWORD = "hunter2-Zq9"
DSN = f"postgresql+psycopg://scheduler:{PASSWORD}@db.internal:5432/scheduler"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJvcGVyYXRvciJ9.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"
FIELDS = {"time", "level", "logger", "message"}


class Lines:
    """The JSON lines a handler on the ``scheduler`` logger wrote."""

    def __init__(self) -> None:
        self.stream = io.StringIO()

    def parsed(self) -> list[dict[str, Any]]:
        text = self.stream.getvalue()
        return [json.loads(line) for line in text.splitlines()]

    def clear(self) -> None:
        self.stream.seek(0)
        self.stream.truncate()


@pytest.fixture
def json_lines() -> Iterator[Lines]:
    lines = Lines()
    handler = logging.StreamHandler(lines.stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("scheduler")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def failing_service(settings: Settings, engine: Engine, clock: ManualClock, *, observer: TracingObserver | None = None,
                    ) -> SchedulerService:
    """A service whose dispatcher fails for ``carl`` with an error quoting a DSN."""
    dispatcher = FakeDispatcher(NudgingPlatform(load_catalogue(None)),
                                fail_for={"carl": RuntimeError(f"could not reach {DSN}")})
    return SchedulerService(settings, engine=engine, clock=clock, publisher=RecordingPublisher(),
                            dispatcher=dispatcher, run_scheduler=False, observer=observer)


@pytest.mark.clause("LOG-1")
def test_a_json_line_carries_the_event_id_and_the_replica_of_a_dispatch_that_logs(
    settings: Settings, engine: Engine, clock: ManualClock, json_lines: Lines
) -> None:
    """LOG-1: a failing dispatch logs with its traceback: every line one JSON object with
    time, level, logger, message; the dispatch's lines name its event id and the replica."""
    service = failing_service(settings, engine, clock)
    with TestClient(service.app) as client:
        event_id = post_event(client, user_id="carl", trigger_at=T0)["id"]
        clock.advance(timedelta(seconds=1))
        loop_step(service)
    lines = json_lines.parsed()
    assert lines and all(line.keys() >= FIELDS for line in lines)
    failure = next(line for line in lines
                   if line["logger"].startswith("scheduler.core.") and line["level"] == "ERROR")
    assert failure["event_id"] == event_id
    assert failure["replica"] == service.heartbeat.replica_id
    assert "RuntimeError" in failure["exception"] and "\n" in failure["exception"]
    assert PASSWORD not in json.dumps(lines)  # the error's DSN is redacted in message and traceback
    assert "trace_id" not in failure  # tracing is off
    assert all("event_id" not in line for line in lines if line["logger"].startswith("scheduler.service"))
    # the time is UTC with milliseconds
    assert failure["time"].endswith("+00:00") and len(failure["time"]) == len("2026-11-30T09:00:00.000+00:00")


@pytest.mark.clause("LOG-1")
def test_with_tracing_on_a_json_line_carries_the_trace_id_of_the_dispatch_span(
    settings: Settings, engine: Engine, clock: ManualClock, json_lines: Lines
) -> None:
    """LOG-1: under a span, the line's trace_id and span_id are the span's."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    service = failing_service(settings, engine, clock, observer=TracingObserver(provider))
    with TestClient(service.app) as client:
        post_event(client, user_id="carl", trigger_at=T0)
        loop_step(service)
    [dispatch] = [s for s in spans.get_finished_spans() if s.name == "scheduler.dispatch"]
    assert dispatch.context is not None
    failure = next(line for line in json_lines.parsed() if line["level"] == "ERROR")
    assert failure["trace_id"] == f"{dispatch.context.trace_id:032x}"
    assert failure["span_id"] == f"{dispatch.context.span_id:016x}"


@pytest.mark.clause("OBS-8")
def test_two_services_in_one_process_each_name_their_own_replica_on_their_requests_and_polls_lines(
    settings: Settings, engine: Engine, clock: ManualClock, json_lines: Lines, request: pytest.FixtureRequest
) -> None:
    """OBS-8: two services built in one process, each with its own heartbeat id: a live
    event's request and a poll of each service's loop log lines (the default publisher's, at
    DEBUG) that name that service's replica, never the other's or none."""
    publisher_log = logging.getLogger("scheduler.nudging.orchestrator")
    publisher_log.setLevel(logging.DEBUG)
    request.addfinalizer(lambda: publisher_log.setLevel(logging.NOTSET))
    first = SchedulerService(settings, engine=engine, clock=clock, run_scheduler=False)
    second = SchedulerService(settings, engine=engine, clock=clock, run_scheduler=False)
    assert first.heartbeat.replica_id != second.heartbeat.replica_id
    with TestClient(first.app) as first_client, TestClient(second.app) as second_client:
        for service, client, user in ((first, first_client, "ann"), (second, second_client, "bob")):
            body = event_body(user_id=user)
            del body["trigger_at"]
            json_lines.clear()
            response = client.post("/admin/ingest-event", headers=INGEST, json=body)
            assert response.status_code < 300, response.text
            requested = [line for line in json_lines.parsed() if line["logger"].startswith("scheduler.")]
            assert any(user in line["message"] for line in requested)  # the live notification's line
            assert {line.get("replica") for line in requested} == {service.heartbeat.replica_id}
            post_event(client, user_id=f"{user}-polled", trigger_at=T0)  # a day's cap: another participant
            clock.advance(timedelta(seconds=1))
            json_lines.clear()
            loop_step(service)
            polled = [line for line in json_lines.parsed() if line["logger"].startswith("scheduler.")]
            assert any(f"{user}-polled" in line["message"] for line in polled)  # the poll's notification's line
            assert {line.get("replica") for line in polled} == {service.heartbeat.replica_id}


def _record(message: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("scheduler.test", logging.WARNING, __file__, 1, message, args, exc_info)


@pytest.mark.clause("LOG-2")
@pytest.mark.parametrize("fmt", ["json", "text"])
def test_neither_format_writes_a_connection_string_password_or_a_token(fmt: str) -> None:
    """LOG-2: a DSN's password (URL and libpq keywords), a bearer token, a bare JWT and
    token/secret values are redacted from the message, its arguments and a traceback;
    what helps an operator (host, database, user) stays."""
    formatter = JsonFormatter() if fmt == "json" else RedactingFormatter("%(message)s")
    try:
        raise ConnectionError(f"connection to {DSN} refused")
    except ConnectionError as caught:
        error = caught
    records = [
        _record("connecting to %s", DSN),
        _record("conninfo: host=db.internal dbname=scheduler user=scheduler password=%s sslmode=require", PASSWORD),
        _record("conninfo: host=db.internal password='%s x' port=5432", PASSWORD),
        _record("request headers: {'authorization': 'Bearer %s'}", JWT),
        _record("cookie token is %s", JWT),
        _record("GET /inbox/stream?access_token=%s&after=3", JWT),
        _record('settings {"jwt_secret": "%s", "SCHEDULER_JWT_SECRET=%s"}', PASSWORD, PASSWORD),
        _record("database unavailable", exc=error),
    ]
    written = [formatter.format(record) for record in records]
    for line in written:
        assert PASSWORD not in line and JWT not in line and JWT.split(".")[2] not in line, line
    assert "db.internal" in written[0] and "scheduler:***@" in written[0]
    assert "Bearer ***" in written[3] and "after=3" in written[5]
    if fmt == "json":
        assert all(line.count("\n") == 0 and json.loads(line)["level"] == "WARNING" for line in written)


@pytest.mark.clause("LOG-2")
def test_redaction_leaves_ordinary_text_alone() -> None:
    """LOG-2: no false alarms on what the service usually logs."""
    for text in ("scheduler: poll failed; the loop continues",
                 "publishing notification 1f2e for http://127.0.0.1:8000/inbox failed",
                 "scheduled event 42 failed (ValueError: bad date); replaying the 3 event(s) before it"):
        assert redact(text) == text


@pytest.mark.clause("LOG-3")
def test_the_log_format_setting_is_validated_and_defaults_to_text() -> None:
    """LOG-3: SCHEDULER_LOG_FORMAT is text (default) or json, any case; anything else is a
    configuration error naming the variable."""
    assert Settings.from_env({}).log_format == "text"
    assert Settings.from_env({"SCHEDULER_LOG_FORMAT": " JSON "}).log_format == "json"
    with pytest.raises(ConfigError, match="SCHEDULER_LOG_FORMAT"):
        Settings.from_env({"SCHEDULER_LOG_FORMAT": "logfmt"})


@pytest.mark.clause("LOG-4")
def test_serve_with_json_logs_writes_only_json_lines(database_url: str, tmp_path: Path) -> None:
    """LOG-4: ``scheduler serve`` with SCHEDULER_LOG_FORMAT=json: its announcement, uvicorn's
    lines and the access log are all JSON objects with the fields, and the replica."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCHEDULER_", "OTEL_"))}
    env.update({"DATABASE_URL": database_url, "SCHEDULER_JWT_SECRET": TEST_SECRET, "SCHEDULER_LOG_FORMAT": "json",
                "PYTHONPATH": str(ROOT)})
    port = free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "scheduler", "serve", "--port", str(port)],
                                   env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "listening on" in log_path.read_text() or process.poll() is not None, 120,
                 "serve to say it is listening")
        assert process.poll() is None, log_path.read_text()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as response:
            assert response.status == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, log_path.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert lines and all(line.keys() >= FIELDS for line in lines), lines
    messages = " | ".join(line["message"] for line in lines)
    assert "listening on" in messages and "Application startup complete" in messages
    assert '"GET /health HTTP/1.1" 200' in messages
    assert any(line.get("replica") for line in lines if line["logger"] == "uvicorn.access")
