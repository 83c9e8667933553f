"""DELIV-19: the production client's direct sends (``delivery.wire``, DEC-DELIVERY-HTTP).

In our words: a send that goes straight to the provider speaks HTTP/1.1 on the scheduler's
own connections, and reads the provider's answer strictly. A length-framed or chunked answer
read to its end leaves its connection for the next send; interim 1xx answers are skipped; an
answer that says ``Connection: close``, an HTTP/1.0 one and a send cut short by its timeout
close their connection. An answer that breaks HTTP/1.1 is a ``Retry`` naming the protocol
error, whatever its bytes: never an exception, never a delivery. HTTPS verifies the
provider's certificate. No more connections are open or opening at once than the limit,
across every provider.

The provider here is a fake at the edge: a TCP server that reads each request and writes
the scripted bytes of an answer, as they are, hostile ones included.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.clock import ManualClock
from scheduler.delivery import http
from scheduler.types import Delivered, Retry, SendResult, Undeliverable

NOW = dt.datetime(2026, 5, 4, 9, 30, tzinfo=dt.UTC)
HANG = None  # an answer that never comes


class ScriptedProvider:
    """A fake provider: each request (its head, then its ``Content-Length`` bytes) is answered
    with the next scripted bytes as they are; ``close_after`` closes the connection after an
    answer; ``HANG`` never answers. Counts the connections it accepted."""

    def __init__(self, answers: Sequence[bytes | None], *, close_after: bool = False,
                 tls: ssl.SSLContext | None = None) -> None:
        self.answers = list(answers)
        self.close_after = close_after
        self.tls = tls
        self.accepted = 0
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/hooks"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers.pop(0)
                if answer is HANG:
                    await reader.read()  # until the client gives up and closes
                    break
                writer.write(answer)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def send(client: http.DeliveryHttp, url: str, timeout: float = 5.0) -> SendResult:
    return await http.post(client, url, content=b'{"n": 1}', headers={"webhook-id": "msg_1"}, timeout=timeout,
                           clock=ManualClock(NOW), retry_after_cap=60.0)


def run(scenario: Any) -> Any:
    return asyncio.run(asyncio.wait_for(scenario, 30))


@pytest.mark.clause("DELIV-19")
def test_a_chunked_answer_is_read_whole_and_its_connection_carries_the_next_send() -> None:
    """DELIV-19: a chunked 200 (two chunks, one with an extension, and a trailer) is delivered
    with its body joined, and the next send goes over the same connection."""
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;note=x\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n")
    answers = [chunked, b"HTTP/1.1 204 No Content\r\n\r\n"]

    async def scenario() -> tuple[list[SendResult], int]:
        async with ScriptedProvider(answers) as provider, http.DeliveryHttp(2) as client:
            results = [await send(client, provider.url), await send(client, provider.url)]
            return results, provider.accepted

    results, accepted = run(scenario())
    assert results == [Delivered(status=200, answer="hello world"), Delivered(status=204, answer="")]
    assert accepted == 1


@pytest.mark.clause("DELIV-19")
def test_interim_answers_are_skipped_and_the_final_one_is_the_result() -> None:
    """DELIV-19: a 100 Continue and a 103 Early Hints before a 201 are skipped; the 201 counts."""
    answer = (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n"
              b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")

    async def scenario() -> SendResult:
        async with ScriptedProvider([answer]) as provider, http.DeliveryHttp(1) as client:
            return await send(client, provider.url)

    assert run(scenario()) == Delivered(status=201, answer="ok")


@pytest.mark.clause("DELIV-19")
def test_connection_close_an_http_1_0_answer_and_a_send_cut_short_each_close_their_connection() -> None:
    """DELIV-19: after an answer saying ``Connection: close``, after an HTTP/1.0 answer and after
    a send its timeout cut short, the next send opens a new connection; each is delivered but
    the one that timed out, a ``Retry``."""
    answers = [b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\na",
               b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nb",
               HANG,
               b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n"]

    async def scenario() -> tuple[list[SendResult], int]:
        async with ScriptedProvider(answers) as provider, http.DeliveryHttp(1) as client:
            results = [await send(client, provider.url), await send(client, provider.url),
                       await send(client, provider.url, timeout=0.3), await send(client, provider.url)]
            return results, provider.accepted

    results, accepted = run(scenario())
    assert results[:2] == [Delivered(status=200, answer="a"), Delivered(status=200, answer="b")]
    assert isinstance(results[2], Retry) and results[2].reason.startswith("timeout")
    assert results[3] == Delivered(status=202, answer="")
    assert accepted == 4


MALFORMED = {
    "not HTTP": b"SMTP/1.0 220 hello\r\n\r\n",
    "a two-digit status": b"HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n",
    "HTTP/2 on a 1.1 connection": b"HTTP/2 200\r\n\r\n",
    "a header without a colon": b"HTTP/1.1 200 OK\r\nContent-Length 0\r\n\r\n",
    "a folded header": b"HTTP/1.1 200 OK\r\nX-A: 1\r\n  continued\r\nContent-Length: 0\r\n\r\n",
    "a non-ASCII header name": "HTTP/1.1 200 OK\r\nX-Grüße: 1\r\nContent-Length: 0\r\n\r\n".encode(),
    "a NUL in a value": b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n",
    "a bare LF ending a line": b"HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n",
    "two lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    "a length that is no number": b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    "both framings": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "a chunk size that is no number": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhi\r\n0\r\n\r\n",
    "a chunk not ended by CRLF": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhiXX0\r\n\r\n",
    "a head longer than 64 KiB": b"HTTP/1.1 200 OK\r\nX-A: " + b"a" * (70 * 1024) + b"\r\n\r\n",
    "switching protocols": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n",
    "an answer cut short": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
    "nothing at all": b"",
}


@pytest.mark.clause("DELIV-19")
@pytest.mark.clause("DEC-DELIVERY-HTTP")
@pytest.mark.parametrize("answer", MALFORMED.values(), ids=MALFORMED.keys())
def test_an_answer_that_breaks_http_1_1_is_a_retry_naming_the_protocol_error(answer: bytes) -> None:
    """DELIV-19: each malformed answer (the provider then closes the connection) is a ``Retry``
    naming ``RemoteProtocolError``, never a delivery and never an exception."""
    async def scenario() -> SendResult:
        async with ScriptedProvider([answer], close_after=True) as provider, http.DeliveryHttp(1) as client:
            return await send(client, provider.url)

    result = run(scenario())
    assert isinstance(result, Retry), result
    assert result.reason.startswith("connection error: RemoteProtocolError"), result.reason


@pytest.mark.clause("DELIV-19")
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head=st.sampled_from([b"", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 503 Busy\r\nRetry-After: 5\r\n",
                             b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"]),
       rest=st.binary(max_size=300) | st.text(max_size=100).map(lambda t: t.encode("utf-8")))
def test_whatever_bytes_a_provider_answers_the_send_is_a_result_and_a_delivery_only_for_a_2xx(
    head: bytes, rest: bytes
) -> None:
    """DELIV-19: hostile and non-ASCII answers (a plausible start, then any bytes, then the
    connection closed) always give a ``SendResult``; a ``Delivered`` only for a 2xx status."""
    async def scenario() -> SendResult:
        async with ScriptedProvider([head + rest], close_after=True) as provider, http.DeliveryHttp(1) as client:
            return await send(client, provider.url)

    result = run(scenario())
    assert isinstance(result, Delivered | Retry | Undeliverable)
    if isinstance(result, Delivered):
        assert result.status is not None and 200 <= result.status <= 299


def _authority(tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for 127.0.0.1: the server's context, and a client's trusting it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "scheduler test provider")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(NOW - dt.timedelta(days=1))
            .not_valid_after(dt.datetime.now(dt.UTC) + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp / "provider.pem", tmp / "provider.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_file, key_file)
    return server, ssl.create_default_context(cafile=str(cert_file))


@pytest.mark.clause("DELIV-19")
def test_https_is_delivered_to_a_provider_whose_certificate_verifies_and_refused_otherwise(tmp_path: Path) -> None:
    """DELIV-19: over TLS, a client trusting the provider's authority delivers twice over one
    connection; a client with the system's trust store (which does not know it) gets a
    ``Retry`` naming the connection error, and nothing reaches the provider."""
    server_tls, trusting = _authority(tmp_path)
    ok = b"HTTP/1.1 204 No Content\r\n\r\n"

    async def scenario() -> tuple[list[SendResult], int, SendResult, int]:
        async with ScriptedProvider([ok, ok], tls=server_tls) as provider:
            async with http.DeliveryHttp(2, ssl_context=trusting) as client:
                trusted = [await send(client, provider.url), await send(client, provider.url)]
            heard = len(provider.requests)
            async with http.DeliveryHttp(2) as client:
                refused = await send(client, provider.url.replace("/hooks", "/other"))
            return trusted, heard, refused, len(provider.requests)

    trusted, heard, refused, requests = run(scenario())
    assert trusted == [Delivered(status=204, answer="")] * 2 and heard == 2
    assert isinstance(refused, Retry) and refused.reason.startswith("connection error: ConnectError"), refused
    assert requests == 2


class CountingProvider(ScriptedProvider):
    """A ``ScriptedProvider`` that also counts its connections open now (a fake at the edge)."""

    def __init__(self, answers: Sequence[bytes | None]) -> None:
        super().__init__(answers)
        self.open = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            await super()._serve(reader, writer)
        finally:
            self.open -= 1


@pytest.mark.clause("DELIV-18")
@pytest.mark.clause("DELIV-19")
def test_the_connection_limit_holds_across_hosts_with_the_connections_being_opened_counted() -> None:
    """DELIV-19: with a limit of 2, two sends at once to one provider leave 2 connections idle;
    two sends at once to another provider then close both of those before theirs are open, so
    no more than 2 stay open (a connection being opened counts against the limit)."""
    ok = b"HTTP/1.1 204 No Content\r\n\r\n"

    async def scenario() -> tuple[list[SendResult], int, int]:
        # answers to spare: a provider keeps each connection open until the client ends it
        async with CountingProvider([ok] * 4) as first, CountingProvider([ok] * 4) as second, \
                http.DeliveryHttp(2) as client:
            results = list(await asyncio.gather(send(client, first.url), send(client, first.url)))
            assert first.accepted == 2  # both kept idle for the first provider
            results += await asyncio.gather(send(client, second.url), send(client, second.url))
            async with asyncio.timeout(5):  # the first provider sees its two connections end
                while first.open:
                    await asyncio.sleep(0.01)
            return results, second.accepted, second.open

    results, accepted, still_open = run(scenario())
    assert results == [Delivered(status=204, answer="")] * 4
    assert accepted == 2 and still_open == 2
