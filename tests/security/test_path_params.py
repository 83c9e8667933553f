"""PARAM-7: path parameters are parsed as strictly as query parameters (DEC-PARAMS).

Every path parameter of every route (event ids, external keys, user ids, session ids) is
sent raw bytes a stranger could put there: bytes that are not UTF-8 once percent-decoded
(which Starlette alone turns into U+FFFD and hands on), a stray ``%``, NUL and other
control characters, an overlong value. Each is a 422 naming the parameter: the project's
JSON error, or the console's error page. Real Unicode still reaches the handler.
The console's static files answer 404 for any name that is not a shipped file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from starlette.routing import Route

from scheduler.service import SchedulerService
from scheduler.web.http.params import MAX_STRING
from tests.security.hostile import Answer, Target, call, targets
from tests.security.test_hostile_input import console_session

NOT_UTF8 = [b"%FF%FE", b"%C3", b"a%C3(", b"%ED%A0%80", b"%C0%AF", b"%F4%90%80%80"]
STRAY_PERCENT = [b"%", b"%zz", b"a%2"]
CONTROL = [b"a%00b", b"%01", b"%1B%5B31m", b"%7F", b"%0D%0A", b"%C2%85", b"a%09b"]
OVERLONG = [b"i" * (MAX_STRING + 1)]
REAL_UNICODE = [b"%C3%A9t%C3%A9", b"%F0%9F%98%80", b"%D7%A9%D7%9C%D7%95%D7%9D"]
STATIC = "/console/static/{name}"


@dataclass(frozen=True)
class PathTarget:
    """One method of one route with path parameters, and the parameter under attack."""

    target: Target
    param: str

    def path(self, raw: bytes) -> str:
        """The route's path with ``param`` as ``raw`` and every other parameter a plain id."""
        def fill(match: re.Match[str]) -> str:
            name = match[1].partition(":")[0]
            return raw.decode("latin-1") if name == self.param else "some-id"
        return re.sub(r"\{([^}]+)\}", fill, self.target.template)


def _path_targets(service: SchedulerService) -> Iterator[PathTarget]:
    routes = {route.path_format: route for route in service.app.routes if isinstance(route, Route)}
    for target in targets(service.app.routes):
        for name in routes[target.template].param_convertors:
            yield PathTarget(target, name)


def _send(service: SchedulerService, spot: PathTarget, raw: bytes) -> Answer:
    session = console_session(service)
    body = b""
    headers = spot.target.credentials(session)
    if spot.target.is_console and spot.target.method == "POST":
        # past the CSRF check, so that the path is what is judged
        opened = service.web_sessions.resolve(session, "admin")
        assert opened is not None
        body = f"csrf={opened.csrf}&reason=r".encode()
        headers = [*headers, (b"content-type", b"application/x-www-form-urlencoded")]
    elif spot.target.method == "PUT":
        body = b'{"max_per_day": 2}'
        headers = [*headers, (b"content-type", b"application/json")]
    return call(service.app, spot.target.method, spot.path(raw), spot.target.finite, headers, body)


def _refused(spot: PathTarget, answer: Answer, raw: bytes) -> None:
    label = f"{spot.target.label} {spot.param}={raw[:40]!r}"
    assert answer.error is None, f"{label}: {answer.error!r}"
    assert answer.status == 422, f"{label}: {answer.status} {answer.text[:300]}"
    if spot.target.is_console:
        assert answer.headers["content-type"].startswith("text/html"), label
        assert f"{spot.param}:" in answer.text, f"{label}: {answer.text[:500]}"
    else:
        errors = json.loads(answer.body)["errors"]
        assert spot.param in [e["field"] for e in errors], f"{label}: {errors}"


def _every_path_parameter(service: SchedulerService) -> list[PathTarget]:
    found = [spot for spot in _path_targets(service) if spot.target.template != STATIC]
    names = {spot.param for spot in found}
    assert {"event_id", "external_key", "user_id", "session_id"} <= names, names
    assert len(found) >= 11, [f"{s.target.label} {s.param}" for s in found]
    return found


@pytest.mark.clause("PARAM-7")
@pytest.mark.parametrize("raw", NOT_UTF8 + STRAY_PERCENT, ids=ascii)
def test_a_path_parameter_that_is_not_utf8_or_badly_percent_encoded_is_a_422_naming_it(
    service: SchedulerService, raw: bytes
) -> None:
    """PARAM-7: ``PUT /admin/participants/%FF%FE/preferences`` and every other route's path
    parameter: bytes that are not UTF-8 once decoded, or a stray ``%``, are a 422 naming it."""
    for spot in _every_path_parameter(service):
        _refused(spot, _send(service, spot, raw), raw)


@pytest.mark.clause("PARAM-7")
@pytest.mark.parametrize("raw", CONTROL + OVERLONG, ids=lambda raw: ascii(raw[:20]))
def test_a_path_parameter_with_a_control_character_or_over_the_limit_is_a_422_naming_it(
    service: SchedulerService, raw: bytes
) -> None:
    """PARAM-7: NUL, ESC, DEL, CR LF, a C1 control, a tab, or 201 characters in any path
    parameter: a 422 naming it (an id is never made of them)."""
    for spot in _every_path_parameter(service):
        _refused(spot, _send(service, spot, raw), raw)


@pytest.mark.clause("PARAM-7")
@pytest.mark.parametrize("raw", REAL_UNICODE, ids=ascii)
def test_real_unicode_in_a_path_parameter_reaches_the_handler(service: SchedulerService, raw: bytes) -> None:
    """PARAM-7: accented letters, emoji, Hebrew: no 422 and no 5xx (a missing row is a 404)."""
    for spot in _every_path_parameter(service):
        answer = _send(service, spot, raw)
        assert answer.error is None and answer.status < 500, (spot.target.label, answer.status, answer.text[:200])
        assert answer.status != 422, (spot.target.label, spot.param, answer.text[:300])


@pytest.mark.clause("PARAM-7")
def test_the_participant_preferences_of_a_garbage_user_id_are_refused_and_nothing_is_stored(
    service: SchedulerService,
) -> None:
    """PARAM-7: the reported ``PUT /admin/participants/%FF%FE/preferences`` stores nothing."""
    spot = next(s for s in _every_path_parameter(service) if s.target.template.startswith("/admin/participants/"))
    _refused(spot, _send(service, spot, b"%FF%FE"), b"%FF%FE")
    with service.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM participant_preferences").scalar_one() == 0


@pytest.mark.clause("PARAM-7")
@pytest.mark.parametrize("name", [b"x" * 300 + b".js", b"x" * 5000 + b".css", b"%FF.js", b"a%00.js", b"..%2Fapp.js",
                                  b".hidden.js", b"nothing.js", b"console.py"], ids=lambda n: ascii(n[:20]))
def test_a_console_static_name_that_is_no_shipped_file_is_a_404(service: SchedulerService, name: bytes) -> None:
    """PARAM-7: any other name, one longer than the file system allows included, is a 404."""
    answer = call(service.app, "GET", "/console/static/" + name.decode("latin-1"))
    assert answer.error is None, repr(answer.error)
    assert answer.status == 404, (answer.status, answer.text[:300])
    shipped = call(service.app, "GET", "/console/static/console.js")
    assert shipped.status == 200, shipped.text[:200]
