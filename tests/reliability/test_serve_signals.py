"""REL-8: `scheduler serve` on its embedded PostgreSQL, stopped by SIGTERM or SIGINT.

SIGTERM is what systemd, Docker and Kubernetes send; SIGINT is Ctrl-C. Both must stop the
service gracefully (a complete lifespan shutdown), exit 0, and stop the embedded
PostgreSQL this process started, so no postmaster is left behind in the data directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reliability.cluster import ROOT, free_port, wait_for

from tests.conftest import TEST_SECRET


def _postmaster_running(pgdata: Path) -> bool:
    """PostgreSQL removes postmaster.pid when it stops; a stale file names a dead pid."""
    pid_file = pgdata / "postmaster.pid"
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text().splitlines()[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.clause("REL-8")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_stops_gracefully_exits_0_and_stops_its_embedded_postgresql(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """REL-8: after the signal, the lifespan shuts down, the exit status is 0, and the
    postmaster of the data directory's embedded server is gone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_") and k != "DATABASE_URL"}
    env.update({"SCHEDULER_DATA_DIR": str(tmp_path / "data"), "SCHEDULER_JWT_SECRET": TEST_SECRET,
                "PYTHONPATH": str(ROOT)})
    log_path = tmp_path / "serve.log"
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "serve", "--port", str(port)],
            env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        wait_for(lambda: "listening on" in log_path.read_text() or process.poll() is not None, 120,
                 "serve to say it is listening")
        assert process.poll() is None, log_path.read_text()
        pgdata = tmp_path / "data" / "pgdata"
        assert _postmaster_running(pgdata)
        sent = time.monotonic()
        process.send_signal(signum)
        code = process.wait(timeout=60)
        elapsed = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    output = log_path.read_text()
    print(f"{signum.name}: exit {code} after {elapsed:.2f}s")
    assert code == 0, output
    assert "Application shutdown complete" in output
    assert not _postmaster_running(pgdata), "the embedded PostgreSQL is still running"
