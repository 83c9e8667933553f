"""SEC-18: a browser session opens only the door it was made for, on every replica, and only while open.

In our words: the service gives browsers two kinds of session, the console's (``admin``) and
the inbox page's (``participant``), one table for both. There are four doors a cookie can be
put to: the console's pages (the ``scheduler_console`` cookie), the inbox page's session
(``GET /inbox/session``, the ``scheduler_inbox`` cookie), the participant API under ``/me``
(the same cookie) and the admin API (bearer tokens only). Each kind's session, put to every
door by hand (the cookie of one kind copied into the other's), opens its own doors only: on
the replica that made it and on another replica of the same database. Signed out, ended by an
admin, past its absolute end or idle too long, it opens none. Neither does anything a reader
of the admin list or the table can copy: a session's public id, its stored hash, or a valid
token of this service put into a cookie.

The matrix is the property: dropping the kind check when a cookie is resolved, or accepting
a token as a cookie, opens a door in it that must stay shut.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, token
from tests.helpers import rows
from tests.operations.support import sign_in as console_sign_in

CONSOLE_COOKIE = "scheduler_console"
INBOX_COOKIE = "scheduler_inbox"


@dataclass(frozen=True)
class Door:
    """Where a browser's cookie is presented, and the answers that mean open and shut."""

    name: str
    cookie: str | None  # the cookie the value is put in; None: the admin API, which reads no cookie
    cookie_path: str
    path: str
    opened: int
    shut: int


DOORS = (
    Door("console", CONSOLE_COOKIE, "/console", "/console", 200, 303),
    Door("inbox page", INBOX_COOKIE, "/", "/inbox/session", 200, 401),
    Door("inbox API", INBOX_COOKIE, "/", "/me/notifications", 200, 401),
    Door("admin API", None, "/", "/admin/sessions", 200, 401),
)
OWN_DOORS = {"admin": {"console"}, "participant": {"inbox page", "inbox API"}}


def door_opens(client: TestClient, door: Door, value: str, *, as_bearer: bool = True) -> bool:
    """Present ``value`` at ``door`` from a browser holding nothing else; whether it opened.

    At the admin API it is tried in every place a browser could put it: both cookies and
    (unless ``as_bearer`` is False: a token *is* a bearer) the ``Authorization`` header."""
    client.cookies.clear()
    if door.cookie is None:
        answers = []
        for cookie, path in ((CONSOLE_COOKIE, "/console"), (INBOX_COOKIE, "/")):
            client.cookies.clear()
            client.cookies.set(cookie, value, path=path)
            answers.append(client.get(door.path, follow_redirects=False).status_code)
        client.cookies.clear()
        if as_bearer:
            answers.append(client.get(door.path, headers={"Authorization": f"Bearer {value}"}).status_code)
    else:
        client.cookies.set(door.cookie, value, path=door.cookie_path)
        answers = [client.get(door.path, follow_redirects=False).status_code]
    client.cookies.clear()
    assert set(answers) <= {door.opened, door.shut}, f"{door.name}: unexpected answers {answers}"
    return door.opened in answers


@dataclass
class BrowserSession:
    """A session as its browser holds it: the kind, the cookie's value and the CSRF token."""

    kind: str
    secret: str
    csrf: str


def open_console_session(client: TestClient, subject: str = "operator-ann", ttl_seconds: int = 3600) -> BrowserSession:
    csrf = console_sign_in(client, subject=subject, ttl_seconds=ttl_seconds)
    secret = client.cookies.get(CONSOLE_COOKIE)
    assert secret
    return BrowserSession("admin", secret, csrf)


def open_inbox_session(client: TestClient, subject: str = "participant-1", ttl_seconds: int = 3600) -> BrowserSession:
    signed_in = client.post("/inbox/session", json={"token": token(None, subject=subject, ttl_seconds=ttl_seconds)})
    assert signed_in.status_code == 201, signed_in.text
    secret = client.cookies.get(INBOX_COOKIE)
    assert secret
    return BrowserSession("participant", secret, str(signed_in.json()["csrf"]))


def opened_doors(clients: dict[str, TestClient], value: str, *, as_bearer: bool = True) -> dict[str, set[str]]:
    """Replica name -> the doors ``value`` opens there."""
    return {replica: {d.name for d in DOORS if door_opens(client, d, value, as_bearer=as_bearer)}
            for replica, client in clients.items()}


@pytest.fixture
def replicas(service: SchedulerService, engine: Engine, clock: ManualClock) -> Iterator[dict[str, TestClient]]:
    """Two replicas of one database (the same clock), each with its own test browser."""
    replica_b = SchedulerService(service.settings, engine=engine, clock=clock, run_scheduler=False)
    with TestClient(service.app) as a, TestClient(replica_b.app) as b:
        yield {"A": a, "B": b}


def _both_kinds(replicas: dict[str, TestClient], ttl_seconds: int = 3600) -> list[BrowserSession]:
    """A console session made on replica A and an inbox session made on replica B."""
    with TestClient(replicas["A"].app) as browser_a, TestClient(replicas["B"].app) as browser_b:
        return [open_console_session(browser_a, ttl_seconds=ttl_seconds),
                open_inbox_session(browser_b, ttl_seconds=ttl_seconds)]


@pytest.mark.clause("SEC-18")
def test_each_kind_of_session_opens_its_own_doors_and_no_other_on_either_replica(
    replicas: dict[str, TestClient],
) -> None:
    """SEC-18: the console's session opens the console only; the inbox page's opens the inbox
    page and /me only; neither opens the admin API; the same on the replica that did not make it."""
    for session in _both_kinds(replicas):
        expected = {replica: OWN_DOORS[session.kind] for replica in replicas}
        assert opened_doors(replicas, session.secret) == expected, session.kind


def _sign_out(replicas: dict[str, TestClient], sessions: list[BrowserSession], engine: Engine,
              clock: ManualClock) -> None:
    # each signs out on the replica that did not make it, as a browser behind a balancer might
    console, inbox = sessions
    b = replicas["B"]
    b.cookies.set(CONSOLE_COOKIE, console.secret, path="/console")
    assert b.post("/console/sign-out", data={"csrf": console.csrf}, follow_redirects=False).status_code == 303
    b.cookies.clear()
    a = replicas["A"]
    a.cookies.set(INBOX_COOKIE, inbox.secret, path="/")
    assert a.delete("/inbox/session", headers={"X-CSRF-Token": inbox.csrf}).status_code == 204
    a.cookies.clear()


def _end_by_admin(replicas: dict[str, TestClient], sessions: list[BrowserSession], engine: Engine,
                  clock: ManualClock) -> None:
    for listed in replicas["A"].get("/admin/sessions", headers=ADMIN).json():
        assert replicas["A"].delete(f"/admin/sessions/{listed['id']}", headers=ADMIN).status_code == 200


def _past_absolute_end(replicas: dict[str, TestClient], sessions: list[BrowserSession], engine: Engine,
                       clock: ManualClock) -> None:
    clock.advance(timedelta(seconds=601))  # the 600 s token's end; not idle yet (idle: 30 minutes)


def _idle(replicas: dict[str, TestClient], sessions: list[BrowserSession], engine: Engine,
          clock: ManualClock) -> None:
    idle = max(int(r["idle_seconds"]) for r in rows(engine, "SELECT idle_seconds FROM web_sessions"))
    clock.advance(timedelta(seconds=idle + 1))


Ending = Callable[[dict[str, TestClient], list[BrowserSession], Engine, ManualClock], None]
ENDINGS: dict[str, tuple[Ending, int]] = {  # how a session ends, and the token life it was opened with
    "signed out": (_sign_out, 3600),
    "ended by an admin": (_end_by_admin, 3600),
    "past its absolute end": (_past_absolute_end, 600),
    "idle too long": (_idle, 86_400),
}


@pytest.mark.clause("SEC-18")
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_an_ended_session_of_either_kind_opens_no_door_on_either_replica(
    replicas: dict[str, TestClient], engine: Engine, clock: ManualClock, ending: str
) -> None:
    """SEC-18: signed out, ended by an admin, past its absolute end or idle too long, a session
    of either kind opens none of the four doors, on either replica (the kind check must not be
    the only check that shuts a door)."""
    end, ttl_seconds = ENDINGS[ending]
    sessions = _both_kinds(replicas, ttl_seconds=ttl_seconds)
    for session in sessions:  # open before: the ending is what shuts them
        assert opened_doors(replicas, session.secret)["B"] == OWN_DOORS[session.kind]
    end(replicas, sessions, engine, clock)
    for session in sessions:
        assert opened_doors(replicas, session.secret) == {"A": set(), "B": set()}, (ending, session.kind)


@pytest.mark.clause("SEC-18")
def test_a_sessions_public_id_its_stored_hash_or_a_valid_token_in_a_cookie_opens_no_door(
    replicas: dict[str, TestClient], engine: Engine
) -> None:
    """SEC-18: what an admin's list shows (a session's public id), what the table holds (its
    SHA-256) and a valid token of this service (an admin's, a participant's) are not sessions:
    put where a cookie goes, at every door, they open nothing while the sessions are open."""
    sessions = _both_kinds(replicas)
    listed = [str(s["id"]) for s in replicas["A"].get("/admin/sessions", headers=ADMIN).json()]
    stored = [str(r["secret_hash"]) for r in rows(engine, "SELECT secret_hash FROM web_sessions")]
    assert len(listed) == len(stored) == 2
    copies = {
        **{f"public id {n}": v for n, v in enumerate(listed)},
        **{f"stored hash {n}": v for n, v in enumerate(stored)},
        "admin token": token("nudging.admin", subject="operator-ann"),
        "participant token": token(None, subject="participant-1"),
    }
    # a token is a bearer at the admin API by design; here it is tried only where a cookie goes
    opened = {what: opened_doors(replicas, value, as_bearer="token" not in what) for what, value in copies.items()}
    assert opened == {what: {"A": set(), "B": set()} for what in copies}
    for session in sessions:  # the sessions themselves still open their doors
        assert opened_doors(replicas, session.secret)["A"] == OWN_DOORS[session.kind]
