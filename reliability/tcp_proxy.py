"""A small TCP proxy in a process of its own: 127.0.0.1:PORT to PostgreSQL's Unix socket
(or to another TCP address), optionally a slow link.

``python -m reliability.tcp_proxy --port P --unix /path/.s.PGSQL.5432`` forwards every
connection both ways. The partition scenario puts one replica behind it and freezes it with
SIGSTOP: both sockets stay open and the kernel keeps acknowledging what the replica sends,
so neither side sees an error; PostgreSQL sees the replica's session sit still (``idle in
transaction`` mid-batch), exactly as with a frozen network path or a paused VM.

``--connect HOST:PORT --delay-ms D`` forwards to a TCP address and holds every chunk D ms in
each direction before passing it on, in order: a link with latency. The failover scenario
streams a standby's WAL through one and kills it with the primary, so what was on the wire
when the primary's host died never arrives, as when a host and its network go at once.
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


async def _delayed_pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Pass each chunk on ``delay`` seconds after it arrived, in order."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            arrived, data = await queue.get()
            if not data:
                break
            await asyncio.sleep(max(0.0, arrived + delay - loop.time()))
            writer.write(data)
            await writer.drain()

    sender = asyncio.ensure_future(send())
    try:
        while data := await reader.read(CHUNK):
            queue.put_nowait((loop.time(), data))
    except (ConnectionError, OSError):
        pass
    finally:
        queue.put_nowait((loop.time(), b""))
        with contextlib.suppress(ConnectionError, OSError):
            await sender
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(port: int, unix_path: str | None, target: tuple[str, int] | None = None, delay: float = 0.0) -> None:
    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            if target is not None:
                server_reader, server_writer = await asyncio.open_connection(*target)
            else:
                assert unix_path is not None
                server_reader, server_writer = await asyncio.open_unix_connection(unix_path)
        except OSError:
            client_writer.close()
            return
        if delay > 0:
            await asyncio.gather(_delayed_pipe(client_reader, server_writer, delay),
                                 _delayed_pipe(server_reader, client_writer, delay))
        else:
            await asyncio.gather(_pipe(client_reader, server_writer), _pipe(server_reader, client_writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


class TcpProxy:
    """The proxy as a child process: ``stop()`` ends it; ``freeze()``/``thaw()`` SIGSTOP/SIGCONT it."""

    def __init__(self, unix_path: str | None, log_path: Path, *, target: tuple[str, int] | None = None,
                 delay_ms: float = 0.0) -> None:
        self.unix_path = unix_path
        self.target = target
        self.delay_ms = delay_ms
        self.port = free_port()
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.frozen = False

    def start(self) -> None:
        with self.log_path.open("ab") as log_file:
            where = (["--connect", f"{self.target[0]}:{self.target[1]}"] if self.target is not None
                     else ["--unix", str(self.unix_path)])
            self.process = subprocess.Popen(
                [sys.executable, "-m", "reliability.tcp_proxy", "--port", str(self.port), *where,
                 "--delay-ms", str(self.delay_ms)],
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

    def kill(self) -> None:
        """SIGKILL: the link is gone, and whatever it held with it."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.kill()
        self.process.wait(timeout=10)

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
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--unix", help="PostgreSQL's socket file")
    where.add_argument("--connect", help="HOST:PORT to forward to over TCP instead")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="hold each chunk this long, each way (default 0)")
    args = parser.parse_args()
    target = None
    if args.connect:
        host, _, port = args.connect.rpartition(":")
        target = (host, int(port))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port, args.unix, target, args.delay_ms / 1000))


if __name__ == "__main__":
    main()
