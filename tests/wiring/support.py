"""Builders for the wiring tests: a service built the way production builds it (from an
environment), and a JWKS endpoint on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from tests.conftest import T0


@contextmanager
def service_from_env(env: Mapping[str, str], **kwargs: Any) -> Iterator[SchedulerService]:
    """``SchedulerService(Settings.from_env(env))``: the service builds its own engines from
    ``DATABASE_URL``, as ``scheduler serve`` does; they are disposed afterwards."""
    service = SchedulerService(Settings.from_env(env), clock=kwargs.pop("clock", ManualClock(T0)), **kwargs)
    try:
        yield service
    finally:
        service.engine.dispose()
        service.loop_engine.dispose()


@dataclass
class JWKSEndpoint:
    """A JWKS document served on 127.0.0.1; ``gate`` (when cleared) holds every fetch."""

    url: str
    key: rsa.RSAPrivateKey
    fetches: list[float] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)
    fetching: threading.Event = field(default_factory=threading.Event)

    def token(self, claims: dict[str, Any]) -> str:
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": "wiring-key"})


@contextmanager
def jwks_endpoint(key: rsa.RSAPrivateKey) -> Iterator[JWKSEndpoint]:
    """Serve ``key``'s public half as a JWKS on loopback (never any other address)."""
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    document = json.dumps({"keys": [{**public, "kid": "wiring-key", "use": "sig", "alg": "RS256"}]}).encode()
    endpoint: JWKSEndpoint

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            endpoint.fetching.set()
            if not endpoint.gate.wait(timeout=30):
                self.send_error(504)
                return
            endpoint.fetches.append(0.0)
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(document)))
            self.end_headers()
            self.wfile.write(document)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    endpoint = JWKSEndpoint(url=f"http://127.0.0.1:{server.server_address[1]}/jwks.json", key=key)
    endpoint.gate.set()
    thread = threading.Thread(target=server.serve_forever, name="jwks", daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        endpoint.gate.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
