"""WIRE-LISTEN-1: a listener restart runs exactly one thread; the earlier run's is gone.

The earlier thread is caught where the old listener left one behind: still connecting
when ``stop`` gave up on it. A fake database at the true edge (a TCP socket that accepts
and never answers) holds it there for as long as the test wants.
"""

from __future__ import annotations

import logging
import socket
import threading

import pytest
from sqlalchemy import Engine

from scheduler.database.listener import Listener, conninfo_of
from tests.helpers import DEADLINE_SECONDS


def _listen_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"{name}-listen" and t.is_alive()]


@pytest.mark.clause("WIRE-LISTEN-1")
def test_a_restarted_listener_runs_one_fresh_thread_and_the_first_one_ends(engine: Engine) -> None:
    """WIRE-LISTEN-1: start, stop, start, stop: each start runs a fresh thread, stop joins it, and
    after each step exactly the current run's thread (or none) is alive."""
    listener = Listener(conninfo_of(engine), name="restarted", probe_engine=engine, probe_seconds=DEADLINE_SECONDS)
    listener.subscribe("scheduler_due", lambda payload: None)
    try:
        listener.start(wait_seconds=DEADLINE_SECONDS)
        first = listener.thread
        assert first is not None and listener.available
        assert _listen_threads("restarted") == [first]
        assert listener.stop(timeout=DEADLINE_SECONDS)
        assert not first.is_alive() and listener.thread is None and not listener.running

        listener.start(wait_seconds=DEADLINE_SECONDS)
        second = listener.thread
        assert second is not None and second is not first and listener.available
        assert _listen_threads("restarted") == [second]
        assert listener.connects == 2
    finally:
        assert listener.stop(timeout=DEADLINE_SECONDS)
    assert _listen_threads("restarted") == []


@pytest.mark.clause("WIRE-LISTEN-1")
def test_a_thread_stop_could_not_join_is_reported_and_does_not_carry_on_after_a_restart(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """WIRE-LISTEN-1: stop gives up on a thread stuck connecting and says so (False, a warning);
    the restart runs a fresh thread; once the stuck attempt fails, the first thread ends by itself
    instead of retrying, and the listener's status stays the new run's."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # a database that never answers
        silent.settimeout(DEADLINE_SECONDS)
        port = silent.getsockname()[1]
        listener = Listener(f"postgresql://nobody@127.0.0.1:{port}/nothing?sslmode=disable&gssencmode=disable",
                            name="stuck", retry_seconds=0.01, probe_engine=engine, probe_seconds=DEADLINE_SECONDS)
        listener.subscribe("scheduler_due", lambda payload: None)
        listener.start(wait_seconds=0)
        first = listener.thread
        assert first is not None
        attempt, _ = silent.accept()  # the first thread is now connecting, and will wait
        with attempt, caplog.at_level(logging.WARNING, logger="scheduler.database.listener"):
            assert listener.stop(timeout=0.05) is False
            assert first.is_alive()
            assert "did not end within" in caplog.text

            listener.conninfo = conninfo_of(engine)
            listener.start(wait_seconds=DEADLINE_SECONDS)
            second = listener.thread
            assert second is not None and second is not first and listener.available
        # The silent server hangs up: the first thread's attempt fails, and it ends.
        first.join(DEADLINE_SECONDS)
        try:
            assert not first.is_alive(), "the first run's thread carried on after the restart"
            assert _listen_threads("stuck") == [second]
            assert listener.available and listener.reason is None
        finally:
            assert listener.stop(timeout=DEADLINE_SECONDS)
    assert _listen_threads("stuck") == []
