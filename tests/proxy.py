"""A TCP proxy in front of PostgreSQL's Unix socket: a fake at the network's edge.

The tests that need to see or shape what crosses the wire (a round trip cut part-way, the
messages a poll sends) put one between a service's engine and the embedded server. The
bytes pass unchanged unless a subclass says otherwise: ``upstream`` may hold back part of
what the client sends, and ``observe_upstream`` sees every byte the client sent.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import make_url


class UnixSocketProxy:
    """Listens on 127.0.0.1 (``port``) and forwards each connection to ``unix_path``."""

    def __init__(self, unix_path: str) -> None:
        self.unix_path = unix_path
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def upstream(self, data: bytes) -> bytes:
        """What to forward of ``data`` from the client (all of it, unless a subclass holds some back)."""
        return data

    def observe_upstream(self, data: bytes) -> None:
        """Every chunk the client sent, before ``upstream`` shapes it."""

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.unix_path)
            self.sockets += [client, server]
            for source, target, up in ((client, server, True), (server, client, False)):
                thread = threading.Thread(target=self._pipe, args=(source, target, up), daemon=True)
                thread.start()
                self.threads.append(thread)

    def _pipe(self, source: socket.socket, target: socket.socket, up: bool) -> None:
        try:
            while data := source.recv(65536):
                if up:
                    self.observe_upstream(data)
                    data = self.upstream(data)
                if data:
                    target.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.listener.close()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for thread in self.threads:
            thread.join(timeout=5)


def unix_socket_of(database_url: str) -> str:
    """The Unix socket of the server behind ``database_url`` (the embedded server's), or skip."""
    url = make_url(database_url)
    host, port = url.query.get("host") or url.host, url.query.get("port") or url.port or 5432
    if not (isinstance(host, str) and host.startswith("/")):
        pytest.skip("the proxy reaches PostgreSQL through its Unix socket (the embedded server's)")
    return str(Path(host) / f".s.PGSQL.{port}")


def through(database_url: str, proxy: UnixSocketProxy) -> str:
    """``database_url`` pointed at ``proxy`` (TCP on 127.0.0.1) instead of the Unix socket."""
    url = make_url(database_url).set(host="127.0.0.1", port=proxy.port)
    url = url.set(query={k: v for k, v in url.query.items() if k not in ("host", "port")})
    return url.render_as_string(hide_password=False)


P = TypeVar("P", bound=UnixSocketProxy)


@contextlib.contextmanager
def running(proxy: P) -> Iterator[P]:
    """``proxy``, closed on the way out."""
    try:
        yield proxy
    finally:
        proxy.close()
