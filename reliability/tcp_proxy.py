"""A small TCP proxy in a process of its own: 127.0.0.1:PORT to PostgreSQL's Unix socket.

``python -m reliability.tcp_proxy --port P --unix /path/.s.PGSQL.5432`` forwards every
connection both ways. The partition scenario puts one replica behind it and freezes it with
SIGSTOP: both sockets stay open and the kernel keeps acknowledging what the replica sends,
so neither side sees an error; PostgreSQL sees the replica's session sit still (``idle in
transaction`` mid-batch), exactly as with a frozen network path or a paused VM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from reliability.cluster import ROOT, ScenarioError, free_port, wait_for

CHUNK = 65536


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(port: int, unix_path: str) -> None:
    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_unix_connection(unix_path)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, server_writer), _pipe(server_reader, client_writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


class TcpProxy:
    """The proxy as a child process: ``stop()`` ends it; ``freeze()``/``thaw()`` SIGSTOP/SIGCONT it."""

    def __init__(self, unix_path: str, log_path: Path) -> None:
        self.unix_path = unix_path
        self.port = free_port()
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.frozen = False

    def start(self) -> None:
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "reliability.tcp_proxy", "--port", str(self.port), "--unix", self.unix_path],
                cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")},
            )

        def listening() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise ScenarioError(f"the TCP proxy exited; see {self.log_path}")
            import socket

            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", self.port)) == 0

        wait_for(listening, 30, "the TCP proxy to listen")

    def freeze(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)
        self.frozen = False

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        if self.frozen:
            self.thaw()  # a stopped process would linger after SIGTERM
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--unix", required=True, help="PostgreSQL's socket file")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port, args.unix))


if __name__ == "__main__":
    main()
