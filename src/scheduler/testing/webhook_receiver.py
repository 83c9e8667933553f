"""A local webhook endpoint (DELIV-17): receives the webhook channel's POSTs over real
loopback HTTP, checks each one's Standard Webhooks signature with the secret it was given
(``scheduler.delivery.signing.verify``; the tests check that function against an HMAC of
their own), and records it. A message that fails the check is answered 401; one that passes
gets the next of the answers it was told to give (``answer(...)``), else ``204``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.core.clock import SystemClock
from scheduler.delivery.signing import WebhookVerificationError, verify
from scheduler.testing.loopback import HANG, Answer, LoopbackFake, Reply, Request, Script
from scheduler.types import Clock

__all__ = ["HANG", "LocalWebhookReceiver", "ReceivedWebhook", "Reply"]

PATH = "/hooks"


@dataclass(frozen=True)
class ReceivedWebhook:
    """One message as the receiver got it: headers, the raw body, its JSON (when it parsed),
    the status answered and why it was refused (empty when the signature verified)."""

    headers: Mapping[str, str]
    body: bytes
    status: int
    payload: Any = None
    problems: tuple[str, ...] = ()

    @property
    def accepted(self) -> bool:
        return not self.problems


class LocalWebhookReceiver(LoopbackFake):
    """The fake endpoint at ``url`` while entered. With ``secret`` (a key or its ``whsec_``
    text) every message must be signed with it; without, none is checked."""

    def __init__(self, secret: bytes | str | None = None, *, clock: Clock | None = None) -> None:
        super().__init__()
        self._secret = secret
        self._clock: Clock = clock or SystemClock()
        self._script = Script(Reply.of(204))
        self.received: list[ReceivedWebhook] = []

    @property
    def url(self) -> str:
        return self._server.url + PATH

    def answer(self, *answers: Answer) -> None:
        """The next answers to messages that verify, in order (then ``204``)."""
        self._script.push(*answers)

    async def _handle(self, request: Request) -> Answer:
        problems: list[str] = []
        if request.method != "POST" or request.target != PATH:
            problems.append(f"not a POST to {PATH}")
        elif self._secret is not None:
            try:
                verify(self._secret, request.headers, request.body, now=self._clock.now())
            except WebhookVerificationError as refused:
                problems.append(str(refused))
        try:
            payload = json.loads(request.body)
        except ValueError:
            payload = None
        if problems:
            self.received.append(ReceivedWebhook(request.headers, request.body, 401, payload, tuple(problems)))
            return Reply.of(401, "; ".join(problems))
        answer = self._script.next()
        status = answer.status if isinstance(answer, Reply) else 0
        self.received.append(ReceivedWebhook(request.headers, request.body, status, payload))
        return answer if isinstance(answer, Reply) else HANG
