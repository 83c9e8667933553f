"""Bearer JWT authentication on Starlette's ``AuthenticationMiddleware``.

A token's grants map to permissions (``Grants``): by default the ``scope`` claim's
``nudging.ingest`` grants ``ingest`` and ``nudging.admin`` grants ``admin`` and ``ingest``; the
claims and values are settings, so a host's identity provider's roles can be used as they
are. A host may instead authenticate requests its own way: any Starlette
``AuthenticationBackend`` returning ``authenticated(subject, permissions)`` (DEC-AUTH-1). A
missing or bad token is a 401 with ``WWW-Authenticate: Bearer``; a valid token without the
permission is a 403 naming it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import anyio.to_thread
import jwt
from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    BaseUser,
    has_required_scope,
    requires,
)
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response

from scheduler.config import Settings
from scheduler.core.clock import SystemClock
from scheduler.database.models import NAME_LENGTH
from scheduler.types import Clock
from scheduler.web.http.params import check_text

PERMISSION_SCOPES = {"ingest": "nudging.ingest", "admin": "nudging.admin"}
# Any valid token, a participant's (no scope) included: the routes under /me, which serve
# the token's own subject.
PARTICIPANT = "participant"
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="nudging"'}

Endpoint = Callable[..., Awaitable[Response]]


class Principal(BaseUser):
    def __init__(self, subject: str, scopes: Sequence[str]) -> None:
        self.subject = subject
        self.scopes = tuple(scopes)

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def display_name(self) -> str:
        return self.subject


def actor_of(request: Request) -> str | None:
    """Who made a change: the request's subject (None without one)."""
    return subject_of(request.user)


class TokenVerifier:
    """Verifies tokens with exactly one configured key type, so algorithms cannot be confused."""

    def __init__(self, settings: Settings, secret: str | None = None, clock: Clock | None = None) -> None:
        # The clock a token's exp, nbf and iat are judged by (and its remaining life read
        # from): production's is the database's (DEC-10), as for everything else it stamps.
        self.clock: Clock = clock or SystemClock()
        self.audience = settings.jwt_audience
        self.leeway_seconds = settings.jwt_leeway_seconds
        self.issuer = settings.jwt_issuer
        self.grants = Grants.from_settings(settings)
        # The secret `serve` generated into the data directory counts in development only:
        # in production only an explicit one verifies (SEC-9; with a host's own authentication
        # and no key, the console's and the inbox page's sign-in refuse every token, PERM-11).
        if secret is None:
            secret = settings.jwt_secret if settings.environment == "production" else settings.effective_jwt_secret()
        self._secret = secret
        self._public_key = settings.jwt_public_key
        self._jwks = jwt.PyJWKClient(settings.jwks_url) if settings.jwks_url else None

    @property
    def configured(self) -> bool:
        return bool(self._secret or self._public_key or self._jwks)

    @property
    def fetches_keys(self) -> bool:
        """True when verifying may fetch keys over the network (a JWKS endpoint)."""
        return self._jwks is not None

    def seconds_left(self, claims: dict[str, Any]) -> float:
        """A verified token's remaining life: its ``exp`` less this verifier's clock's now."""
        return float(claims["exp"]) - self.clock.now().timestamp()

    async def verify_async(self, token: str) -> dict[str, Any]:
        """``verify`` for async code: a JWKS fetch (blocking network I/O) runs in a worker
        thread, so a slow key endpoint never stalls the event loop."""
        if self.fetches_keys:
            claims: dict[str, Any] = await anyio.to_thread.run_sync(self.verify, token)
            return claims
        return self.verify(token)

    def verify(self, token: str) -> dict[str, Any]:
        # PyJWT checks the signature, audience, issuer and required claims; the times are
        # checked below by this verifier's clock, since PyJWT reads the host's and takes no now
        options = {"require": ["exp", "sub"], "verify_exp": False, "verify_nbf": False, "verify_iat": False}
        common: dict[str, Any] = {"audience": self.audience, "options": options}
        if self.issuer:
            common["issuer"] = self.issuer
        if self._jwks is not None:
            key = self._jwks.get_signing_key_from_jwt(token).key
            claims = dict(jwt.decode(token, key, algorithms=["RS256"], **common))
        elif self._public_key:
            claims = dict(jwt.decode(token, self._public_key, algorithms=["RS256"], **common))
        elif self._secret:
            claims = dict(jwt.decode(token, self._secret, algorithms=["HS256"], **common))
        else:
            raise jwt.InvalidTokenError("the service has no way to verify tokens configured")
        check_token_times(claims, self.clock.now().timestamp(), self.leeway_seconds)
        check_subject(claims["sub"])
        return claims


def check_subject(subject: object) -> None:
    """A token's ``sub`` is who acts: audit rows, the event history and browser sessions store
    it, ``/me`` reads by it. One that names no one or cannot be stored (empty, longer than the
    columns' 200 characters, a NUL, an unpaired surrogate) makes the token invalid: a
    ``jwt.InvalidTokenError`` naming the claim (a 401), never a 422 or a 500 later (SEC-7.1)."""
    if not isinstance(subject, str):
        raise jwt.InvalidTokenError(f"the subject claim (sub) must be a string (not {type(subject).__name__})")
    if not subject:
        raise jwt.InvalidTokenError("the subject claim (sub) is empty: it must name who is calling")
    if len(subject) > NAME_LENGTH:
        raise jwt.InvalidTokenError(f"the subject claim (sub) is longer than {NAME_LENGTH} characters")
    try:
        check_text(subject)
    except ValueError as exc:
        raise jwt.InvalidTokenError(f"the subject claim (sub) {exc}") from None


# The NumericDates this verifier reads: the span of years 1 to 9999 (anything else cannot be
# a time any clock here tells, and would overflow the float arithmetic below).
_NUMERIC_DATE_MIN = -62_135_596_800
_NUMERIC_DATE_MAX = 253_402_300_799


def numeric_date(claims: dict[str, Any], name: str, what: str) -> float | None:
    """A time claim as RFC 7519 defines it, a NumericDate: a JSON number (an integer or a
    fraction), never a string or a boolean; ``None`` when absent. Anything else is a
    ``jwt.InvalidTokenError`` naming the claim (a 401)."""
    if name not in claims:
        return None
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise jwt.InvalidTokenError(f"{what} claim ({name}) must be a NumericDate, a JSON number "
                                    f"(not {type(value).__name__})")
    if not (isinstance(value, int) or math.isfinite(value)) or not _NUMERIC_DATE_MIN <= value <= _NUMERIC_DATE_MAX:
        raise jwt.InvalidTokenError(f"{what} claim ({name}) is out of range")
    return float(value)


def check_token_times(claims: dict[str, Any], now: float, leeway: float = 0.0) -> None:
    """PyJWT's checks of ``exp``, ``nbf`` and ``iat`` (its errors and messages), with
    ``leeway`` seconds for clocks that differ, against ``now`` from the verifier's clock
    instead of the host's. Each present time claim must be a NumericDate (``numeric_date``)."""
    exp = numeric_date(claims, "exp", "Expiration Time")
    nbf = numeric_date(claims, "nbf", "Not Before")
    iat = numeric_date(claims, "iat", "Issued At")
    if exp is not None and exp + leeway <= now:
        raise jwt.ExpiredSignatureError("Signature has expired")
    if nbf is not None and nbf - leeway > now:
        raise jwt.ImmatureSignatureError("The token is not yet valid (nbf)")
    if iat is not None and iat - leeway > now:
        raise jwt.ImmatureSignatureError("The token is not yet valid (iat)")


def token_problem(exc: jwt.PyJWTError) -> str:
    """What is wrong with a refused token, for the person who sent it: a value that is not a
    JWT at all is "malformed" (the decoder's own words mean nothing to them)."""
    if isinstance(exc, jwt.DecodeError) and not isinstance(exc, jwt.InvalidSignatureError):
        return "malformed token: not a JWT (expected header.payload.signature in base64url)"
    return f"invalid token: {exc}"


class Grants:
    """Which claims of a token hold its grants, and which grant values give this service's
    permissions (DEC-AUTH-1): by default ``scope``/``scp`` with ``nudging.admin`` (admin and
    ingest) and ``nudging.ingest``; a host's identity provider may say ``roles`` and ``admin``."""

    def __init__(self, claims: Sequence[str], admin: Sequence[str], ingest: Sequence[str]) -> None:
        self.claims = tuple(claims)
        self.admin = frozenset(admin)
        self.ingest = frozenset(ingest)

    @classmethod
    def from_settings(cls, settings: Settings) -> Grants:
        return cls(settings.jwt_scope_claims.split(), settings.jwt_admin_scopes.split(),
                   settings.jwt_ingest_scopes.split())

    def values(self, claims: dict[str, Any]) -> list[str]:
        """Every grant the token carries: each configured claim, a space-separated string or a
        list of strings (anything else in it is ignored, never an error)."""
        found: list[str] = []
        for name in self.claims:
            raw = claims.get(name)
            if isinstance(raw, str):
                found += raw.split()
            elif isinstance(raw, list):
                found += [v for v in raw if isinstance(v, str)]
        return found

    def permissions(self, claims: dict[str, Any]) -> set[str]:
        """The permissions the token's grants give (``admin`` includes ``ingest``)."""
        values = set(self.values(claims))
        if values & self.admin:
            return {"admin", "ingest"}
        return {"ingest"} if values & self.ingest else set()


def authenticated(subject: str, permissions: Iterable[str], grants: Sequence[str] = ()
                  ) -> tuple[AuthCredentials, BaseUser]:
    """What an ``AuthenticationBackend`` returns for a request it authenticated: ``subject``
    (who acts: audit rows name it, ``/me`` serves its notifications) with ``permissions``
    (``admin``, ``ingest``; none for a participant). A host's own backend returns this."""
    unknown = set(permissions) - set(PERMISSION_SCOPES)
    if unknown:
        raise ValueError(f"unknown permission(s) {sorted(unknown)}: expected admin and/or ingest")
    return AuthCredentials(["authenticated", *sorted(set(permissions))]), Principal(subject, grants)


def subject_of(user: BaseUser) -> str | None:
    """Who a request's user is: a ``Principal``'s subject, else a host user's ``identity``
    (Starlette's ``BaseUser``), else its ``display_name``; ``None`` when unauthenticated."""
    if not user.is_authenticated:
        return None
    if isinstance(user, Principal):
        return user.subject
    try:
        identity = user.identity
    except NotImplementedError:  # BaseUser declares it; a host's user that does not define it
        identity = ""
    return str(identity) if identity else (user.display_name or None)


class JWTBackend(AuthenticationBackend):
    def __init__(self, verifier: TokenVerifier) -> None:
        self.verifier = verifier

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        header = conn.headers.get("authorization")
        if header is None:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthenticationError("malformed Authorization header: expected 'Bearer <token>'")
        try:
            claims = await self.verifier.verify_async(token.strip())
        except jwt.PyJWTError as exc:
            raise AuthenticationError(token_problem(exc)) from exc
        return authenticated(str(claims["sub"]), self.verifier.grants.permissions(claims),
                             self.verifier.grants.values(claims))


def on_auth_error(conn: HTTPConnection, exc: AuthenticationError) -> Response:
    return JSONResponse({"detail": str(exc)}, status_code=401, headers=CHALLENGE)


def require(permission: str) -> Callable[[Endpoint], Endpoint]:
    """Guard an endpoint: 401 without a valid token, 403 naming the missing permission.

    The permission is recorded on the endpoint (``endpoint.permission``) so the route
    table in ``specs/`` can be checked against the running app.
    """
    if permission not in PERMISSION_SCOPES and permission != PARTICIPANT:
        raise ValueError(f"unknown permission {permission!r}")

    def decorator(endpoint: Endpoint) -> Endpoint:
        guarded = requires("authenticated" if permission == PARTICIPANT else permission, status_code=403)(endpoint)

        @functools.wraps(endpoint)
        async def wrapper(*args: Any) -> Response:
            request = args[-1]  # a plain endpoint gets (request,), a method (self, request)
            assert isinstance(request, Request)
            if not request.user.is_authenticated:
                raise HTTPException(401, "missing bearer token", headers=CHALLENGE)
            if permission != PARTICIPANT and not has_required_scope(request, [permission]):
                raise HTTPException(
                    403, f"missing permission: {PERMISSION_SCOPES[permission]} ({permission})"
                )
            response: Response = await guarded(*args)
            return response

        wrapper.permission = permission  # type: ignore[attr-defined]
        return wrapper

    return decorator


def mint_token(
    secret: str,
    *,
    scope: str | None,
    subject: str = "local-operator",
    ttl_seconds: int = 3600,
    audience: str = "svc-nudging",
    issuer: str | None = None,
    clock: Clock | None = None,
) -> str:
    """An HS256 token for local use (``scheduler token``); no scope gives a participant's token.

    Its ``iat``/``nbf``/``exp`` come from ``clock`` (the host's wall clock unless given: the
    issuer's clock, as an identity provider's would be).
    """
    now = int((clock or SystemClock()).now().timestamp())
    claims: dict[str, Any] = {"sub": subject, "aud": audience, "iat": now, "nbf": now, "exp": now + ttl_seconds}
    if scope:
        claims["scope"] = scope
    if issuer:
        claims["iss"] = issuer
    return jwt.encode(claims, secret, algorithm="HS256")
