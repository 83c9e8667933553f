"""A local Web Push service that plays the browser too (DELIV-17), for end-to-end tests of
the web-push channel over real loopback HTTP.

``subscribe()`` makes what a browser would: a P-256 key pair and a 16-byte auth secret, and
an endpoint on this service (``http://127.0.0.1:PORT/push/ID``). Each push it receives is
checked as a push service and a browser would: ``Content-Encoding: aes128gcm``, a ``TTL``, a
valid ``Urgency`` if any, an ``Authorization: vapid t=..., k=...`` whose ES256 JWT verifies
with ``k`` (the ``applicationServerKey`` the subscription was made with, when given), names
this origin as ``aud``, expires within 24 hours and has a ``mailto:``/``https:`` ``sub``;
then the body is decrypted with the subscription's private key and auth secret (RFC 8291
with the ``cryptography`` HKDF, independently of ``scheduler.delivery``). What it got is
recorded in ``received``. A push that fails a check is answered 400 (the body) or 401 (the
VAPID token), an unknown subscription 404; one that passes gets the next of the answers it
was told to give (``answer(...)``: any ``Reply``, or ``HANG``), else ``201 Created``.

A push service's real endpoints are ``https`` URLs on a public host, which is all that
``SCHEDULER_PUSH_ALLOWED_HOSTS`` lets a participant subscribe with. ``public_origin`` gives
the service such a name (``LocalPushService(public_origin="https://push.example.test")``): its
endpoints and the VAPID ``aud`` it expects are then that origin's, and ``transport()`` is an
``httpx`` transport that carries requests for it to this loopback server (what DNS and TLS
would do), so a test can subscribe through ``PUT /me/push-subscriptions`` and be pushed to.
"""

from __future__ import annotations

import base64
import secrets
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import jwt
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from scheduler.core.clock import SystemClock
from scheduler.testing.loopback import HANG, Answer, LoopbackFake, Reply, Request, Script
from scheduler.types import Clock, PushTarget

__all__ = ["HANG", "Browser", "LocalPushService", "PushRefused", "ReceivedPush", "Reply", "decrypt_push"]

URGENCIES = frozenset({"very-low", "low", "normal", "high"})
MAX_TOKEN_LIFETIME = timedelta(hours=24)


class PushRefused(ValueError):
    """A push body this browser cannot open; the text says why."""


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _point(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)


def decrypt_push(body: bytes, private_key: ec.EllipticCurvePrivateKey, auth_secret: bytes) -> bytes:
    """The plaintext of an ``aes128gcm`` push body, as the browser that holds ``private_key``
    and ``auth_secret`` opens it (RFC 8291 §3, RFC 8188 §2); ``PushRefused`` otherwise."""
    if len(body) < 21:
        raise PushRefused("shorter than an aes128gcm header")
    salt, record_size, id_length = body[:16], struct.unpack("!I", body[16:20])[0], body[20]
    if id_length != 65:
        raise PushRefused(f"the key id must be the sender's 65-byte public key, it is {id_length} bytes")
    sender_point, record = body[21:86], body[86:]
    if record_size < 18 or len(record) > record_size:
        raise PushRefused("not one record of at most the record size")
    try:
        sender = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), sender_point)
    except ValueError:
        raise PushRefused("the key id is not a P-256 point") from None
    shared = private_key.exchange(ec.ECDH(), sender)
    key_info = b"WebPush: info\x00" + _point(private_key.public_key()) + sender_point
    ikm = HKDF(hashes.SHA256(), 32, salt=auth_secret, info=key_info).derive(shared)
    cek = HKDF(hashes.SHA256(), 16, salt=salt, info=b"Content-Encoding: aes128gcm\x00").derive(ikm)
    nonce = HKDF(hashes.SHA256(), 12, salt=salt, info=b"Content-Encoding: nonce\x00").derive(ikm)
    try:
        padded = AESGCM(cek).decrypt(nonce, record, None)
    except InvalidTag:
        raise PushRefused("the record does not decrypt with this subscription's keys") from None
    unpadded = padded.rstrip(b"\x00")
    if not unpadded or unpadded[-1] != 0x02:
        raise PushRefused("the last record does not end with the padding delimiter 0x02")
    return unpadded[:-1]


@dataclass(frozen=True)
class Browser:
    """A subscription as the browser holds it: what the server is given (``target``, the
    ``PushSubscription``'s content) and the private half it decrypts with."""

    target: PushTarget
    private_key: ec.EllipticCurvePrivateKey = field(repr=False)
    application_server_key: str | None = None

    @property
    def subscription_id(self) -> str:
        assert self.target.subscription_id is not None
        return self.target.subscription_id

    def subscription_json(self) -> dict[str, Any]:
        """The W3C ``PushSubscription.toJSON()`` of it."""
        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).decode().rstrip("=")
        return {"endpoint": self.target.endpoint, "expirationTime": None,
                "keys": {"p256dh": b64(self.target.p256dh), "auth": b64(self.target.auth)}}


@dataclass(frozen=True)
class ReceivedPush:
    """One push as the service got it: which subscription, the headers, the body, what it
    decrypted to and the VAPID claims (when the checks passed), why it refused it otherwise,
    and the status it answered."""

    subscription_id: str | None
    headers: Mapping[str, str]
    body: bytes
    status: int
    plaintext: bytes | None = None
    claims: Mapping[str, Any] | None = None
    problems: tuple[str, ...] = ()

    @property
    def accepted(self) -> bool:
        return not self.problems


class LocalPushService(LoopbackFake):
    """The fake push service, serving while entered (``async with LocalPushService() as push``).
    ``clock`` judges the VAPID token's ``exp`` (the wall clock by default)."""

    def __init__(self, *, clock: Clock | None = None, public_origin: str | None = None) -> None:
        super().__init__()
        if public_origin is not None and (not public_origin.startswith("https://") or public_origin.count("/") != 2):
            raise ValueError(f"a public origin is https://host[:port], got {public_origin!r}")
        self._public_origin = public_origin
        self._clock: Clock = clock or SystemClock()
        self._browsers: dict[str, Browser] = {}
        self._gone: set[str] = set()
        self._script = Script(Reply.of(201, headers={"Location": "/message/1"}))
        self.received: list[ReceivedPush] = []

    @property
    def origin(self) -> str:
        """The origin of its endpoints: the public one when given, else the loopback URL."""
        return self._public_origin or self._server.url

    def transport(self) -> httpx.AsyncBaseTransport:
        """An ``httpx`` transport that sends requests for ``public_origin`` to this server
        (any other request goes out as it is)."""
        return _ToLoopback(self)

    def subscribe(self, *, application_server_key: str | None = None) -> Browser:
        """A new subscription, as a browser makes it (``application_server_key``: the VAPID
        public key it subscribed with; its pushes must then carry that key)."""
        subscription_id = secrets.token_urlsafe(12)
        private_key = ec.generate_private_key(ec.SECP256R1())
        target = PushTarget(endpoint=f"{self.origin}/push/{subscription_id}", p256dh=_point(private_key.public_key()),
                            auth=secrets.token_bytes(16), subscription_id=subscription_id)
        browser = Browser(target, private_key, application_server_key)
        self._browsers[subscription_id] = browser
        return browser

    def unsubscribe(self, browser: Browser) -> None:
        """The browser dropped it: its pushes are answered 410 Gone from now on."""
        self._browsers.pop(browser.subscription_id, None)
        self._gone.add(browser.subscription_id)

    def answer(self, *answers: Answer) -> None:
        """The next answers to pushes that pass the checks, in order (then ``201``): a
        ``Reply`` (``Reply.of(429, retry_after="7")``, ``Reply.of(500)``...) or ``HANG``."""
        self._script.push(*answers)

    def pushes_to(self, browser: Browser) -> list[ReceivedPush]:
        return [p for p in self.received if p.subscription_id == browser.subscription_id]

    async def _handle(self, request: Request) -> Answer:
        subscription_id = request.target.removeprefix("/push/") if request.target.startswith("/push/") else None
        browser = self._browsers.get(subscription_id or "")
        if request.method != "POST" or browser is None:
            gone = subscription_id in self._gone
            status = 410 if gone else 404 if request.method == "POST" else 405
            self.received.append(ReceivedPush(subscription_id, request.headers, request.body, status,
                                              problems=("no such subscription",)))
            return Reply.of(status)
        problems, claims = self._check_vapid(request.headers, browser)
        status = 401 if problems else 400
        problems += self._check_headers(request.headers)
        plaintext = None
        if not problems:
            try:
                plaintext = decrypt_push(request.body, browser.private_key, browser.target.auth)
            except PushRefused as refused:
                problems.append(f"body: {refused}")
        if problems:
            self.received.append(ReceivedPush(subscription_id, request.headers, request.body, status,
                                              claims=claims, problems=tuple(problems)))
            return Reply.of(status, "; ".join(problems))
        answer = self._script.next()
        shown = answer.status if isinstance(answer, Reply) else 0
        self.received.append(ReceivedPush(subscription_id, request.headers, request.body, shown,
                                          plaintext=plaintext, claims=claims))
        return answer if isinstance(answer, Reply) else HANG

    def _check_headers(self, headers: Mapping[str, str]) -> list[str]:
        problems = []
        if headers.get("content-encoding") != "aes128gcm":
            problems.append("Content-Encoding must be aes128gcm")
        ttl = headers.get("ttl", "")
        if not (ttl.isascii() and ttl.isdigit()):
            problems.append("TTL must be a whole number of seconds")
        if "urgency" in headers and headers["urgency"] not in URGENCIES:
            problems.append(f"Urgency must be one of {sorted(URGENCIES)}")
        return problems

    def _check_vapid(self, headers: Mapping[str, str], browser: Browser) -> tuple[list[str], dict[str, Any] | None]:
        scheme, _, params = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "vapid":
            return ["Authorization must be vapid t=..., k=..."], None
        values = dict(part.strip().partition("=")[::2] for part in params.split(","))
        token, k = values.get("t", ""), values.get("k", "")
        if browser.application_server_key is not None and k != browser.application_server_key:
            return ["k is not the applicationServerKey the subscription was made with"], None
        try:
            public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), _unb64url(k))
            claims: dict[str, Any] = jwt.decode(token, public, algorithms=["ES256"], audience=self.origin,
                                                options={"require": ["aud", "exp", "sub"], "verify_exp": False})
        except (ValueError, jwt.PyJWTError) as exc:
            return [f"the VAPID token does not verify: {exc}"], None
        problems = []
        now = self._clock.now().timestamp()
        exp = claims["exp"]
        if not isinstance(exp, int) or exp <= now:
            problems.append("the VAPID token has expired")
        elif exp - now > MAX_TOKEN_LIFETIME.total_seconds():
            problems.append("the VAPID token's exp is more than 24 hours away")
        sub = claims["sub"]
        if not isinstance(sub, str) or not sub.startswith(("mailto:", "https:")):
            problems.append("the VAPID token's sub must be a mailto: or https: contact")
        return problems, claims


class _ToLoopback(httpx.AsyncBaseTransport):
    """Requests for the push service's public origin, to its loopback server (DNS and TLS's part)."""

    def __init__(self, service: LocalPushService) -> None:
        self._service = service
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        public = self._service._public_origin
        if public is not None and str(request.url).startswith(public + "/"):
            request.url = request.url.copy_with(scheme="http", host="127.0.0.1", port=self._service._server.port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()
