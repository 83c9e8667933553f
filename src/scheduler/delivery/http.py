"""One POST of a channel (DELIV-6): the per-send timeout bounds the whole exchange (connect,
write, the answer's head and the part of its body that is read), redirects are never
followed, and at most ``ANSWER_BYTES`` of the answer are read, as sent (``Accept-Encoding:
identity``, never decompressed), whatever the provider sends.
The answer, or the exception, is classified by ``outcome.classify``: this never raises for a
failed send."""

from __future__ import annotations

from collections.abc import Mapping

import anyio
import httpx

from scheduler.delivery.outcome import HttpAnswer, classify
from scheduler.types import Clock, Retry, SendResult

ANSWER_BYTES = 4096


async def post(client: httpx.AsyncClient, url: str, *, content: bytes, headers: Mapping[str, str],
               timeout: float, clock: Clock, retry_after_cap: float, push: bool = False) -> SendResult:
    """POST ``content`` to ``url`` and classify what came back (``push``: 404/410 are ``Gone``)."""
    try:
        with anyio.fail_after(timeout):
            answer = await _exchange(client, url, content, headers, timeout)
    except TimeoutError:
        return Retry(reason=f"timeout: no answer within {timeout:g} s")
    except Exception as exc:  # noqa: BLE001 - a failed send is a result, never an error of the caller's
        return classify(exc, now=clock.now(), retry_after_cap=retry_after_cap, push=push)
    return classify(answer, now=clock.now(), retry_after_cap=retry_after_cap, push=push)


async def _exchange(client: httpx.AsyncClient, url: str, content: bytes, headers: Mapping[str, str],
                    timeout: float) -> HttpAnswer:
    request = client.build_request("POST", url, content=content,
                                   headers={"accept-encoding": "identity", **headers},
                                   timeout=httpx.Timeout(timeout))
    response = await client.send(request, stream=True, follow_redirects=False)
    try:
        body = b""
        async for chunk in response.aiter_raw():
            body += chunk
            if len(body) >= ANSWER_BYTES:
                break
    finally:
        await response.aclose()
    return HttpAnswer(status=response.status_code, headers=response.headers, body=body[:ANSWER_BYTES])
