"""The delivery benchmark's receiver, ``bench.provider`` (PERF-12): what it answers, and when.

Against a real socket on 127.0.0.1; the latency is the provider's own timer, and every wait
has its deadline. No time is asserted beyond the order of events (an answer to a POST comes
after its latency has passed, by the loop's own clock).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any

import pytest
from bench.provider import Record, serve

DEADLINE = 10.0


def run(scenario: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(scenario, 30))


async def _exchange(port: int, raw: bytes, answers: int) -> list[bytes]:
    """Send ``raw`` on one connection; the ``answers`` heads and bodies read back, in order."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        got: list[bytes] = []
        async with asyncio.timeout(DEADLINE):
            for _ in range(answers):
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                got.append(head + await reader.readexactly(length))
        return got
    finally:
        writer.close()


def _post(key: str, body: bytes = b'{"a": 1}', extra: str = "") -> bytes:
    return (f"POST /hooks HTTP/1.1\r\nHost: x\r\nwebhook-id: {key}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            .encode() + body)


@pytest.mark.clause("PERF-12")
def test_the_provider_answers_each_post_after_the_latency_on_one_kept_alive_connection() -> None:
    """PERF-12: each POST on a kept-alive connection is answered 204 after the latency, its key
    recorded once (a repeat keeps the first answer's time); GET /count and /stats read the record."""

    async def scenario() -> None:
        record = Record()
        loop = asyncio.get_running_loop()
        async with await serve(record, 0.05) as server:
            port = server.sockets[0].getsockname()[1]
            started = loop.time()
            answers = await _exchange(port, _post("k-1"), 1)
            assert loop.time() - started >= 0.05
            first = record.first["k-1"]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                for raw in (_post("k-2"), _post("k-1"), b"GET /count?prefix=k- HTTP/1.1\r\nHost: x\r\n\r\n"):
                    writer.write(raw)
                    async with asyncio.timeout(DEADLINE):
                        head = await reader.readuntil(b"\r\n\r\n")
                        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                        answers.append(head + await reader.readexactly(length))
            finally:
                writer.close()
            whole = (await _exchange(port, b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n", 1))[0]
            stats = json.loads(whole.split(b"\r\n\r\n")[1])
        assert [a.split(b"\r\n")[0] for a in answers] == [b"HTTP/1.1 204 No Content"] * 3 + [b"HTTP/1.1 200 OK"]
        assert all(b"Connection: close" not in a for a in answers)
        assert json.loads(answers[3].split(b"\r\n\r\n")[1]) == {"seen": 2, "requests": 3}
        assert record.first["k-1"] == first and sorted(stats["first"]) == ["k-1", "k-2"] and stats["requests"] == 3

    run(scenario())


@pytest.mark.clause("PERF-12")
def test_the_provider_reads_a_request_split_across_packets_and_one_pipelined_behind_it_in_order() -> None:
    """PERF-12: a request sent in pieces is read whole; a second pipelined behind it is answered
    after the first, in order, and a request asking ``Connection: close`` ends the connection."""

    async def scenario() -> None:
        record = Record()
        async with await serve(record, 0.02) as server:
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                whole = _post("split", body=b"x" * 3000) + _post("behind", extra="Connection: close\r\n")
                for start in range(0, len(whole), 700):
                    writer.write(whole[start:start + 700])
                    await writer.drain()
                    await asyncio.sleep(0)
                async with asyncio.timeout(DEADLINE):
                    rest = await reader.read(-1)  # to the provider's close
            finally:
                writer.close()
        assert rest.count(b"HTTP/1.1 204 No Content") == 2 and rest.endswith(b"Connection: close\r\n\r\n")
        assert list(record.first) == ["split", "behind"] and record.requests == 2

    run(scenario())


@pytest.mark.clause("PERF-12")
@pytest.mark.parametrize("raw", [
    b"POST /hooks\r\n\r\n",
    b"POST /hooks HTTP/2\r\nHost: x\r\n\r\n",
    b"POST /hooks HTTP/1.1\r\nno colon here\r\n\r\n",
    b"POST /hooks HTTP/1.1\r\n Host: x\r\n\r\n",
    b"POST /hooks HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /hooks HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    "POST /hooks HTTP/1.1\r\nContent-Length: \uff13\r\n\r\nabc".encode(),  # a fullwidth 3
    b"POST /hooks HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n",
    b"POST /hooks HTTP/1.1\r\nX-Long: " + b"a" * 70_000,
], ids=["no-version", "http2", "no-colon", "folded", "chunked", "negative-length", "non-ascii-length",
        "body-too-large", "head-too-large"])
def test_the_provider_refuses_what_it_cannot_read_and_closes(raw: bytes) -> None:
    """PERF-12: a request it cannot read is answered 400 and the connection closed; nothing is recorded."""

    async def scenario() -> None:
        record = Record()
        async with await serve(record, 0.01) as server:
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(raw)
                async with asyncio.timeout(DEADLINE):
                    answer = await reader.read(-1)
            finally:
                writer.close()
        assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Connection: close" in answer
        assert record.first == {} and record.requests == 0

    run(scenario())
