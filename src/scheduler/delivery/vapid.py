"""VAPID (RFC 8292, DELIV-11): the application server's P-256 key and the header that
identifies it to a push service: ``Authorization: vapid t=<JWT>, k=<public key>``.

The JWT is ES256-signed with ``aud`` the origin of the push endpoint, ``exp`` at most 24 hours
after the request (12 here), and ``sub`` a contact, ``mailto:`` or ``https:``; ``k`` is the
base64url of the 65-byte uncompressed public key, the key the browser subscribed with
(``applicationServerKey``). A key is given as PEM or as the base64url of its 32-byte scalar.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import jwt
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from scheduler.delivery.encryption import public_bytes

MAX_LIFETIME = timedelta(hours=24)  # RFC 8292 §2: exp no more than 24 hours after the request
LIFETIME = timedelta(hours=12)
_B64URL = re.compile(r"[A-Za-z0-9_-]*={0,2}")
# the P-256 group order: a private scalar is 1 to N - 1
_N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
_SUBJECT = re.compile(r"mailto:[^@\s<>\"]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+|https://[A-Za-z0-9.-]+(:\d{1,5})?(/[!-~]*)?",
                      re.ASCII)


def b64url(data: bytes) -> str:
    """Unpadded base64url, as web push writes keys."""
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def b64url_decode(text: str) -> bytes:
    """Strict base64url: its alphabet only, padding optional, the canonical encoding of its bytes."""
    if _B64URL.fullmatch(text) is None:
        raise ValueError("not base64url (A-Z a-z 0-9 - _)")
    bare = text.rstrip("=")
    if len(bare) % 4 == 1 or (text != bare and len(text) % 4):
        raise ValueError("not base64url: wrong length or padding")
    try:
        data = base64.urlsafe_b64decode(bare + "=" * (-len(bare) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not base64url") from None
    if b64url(data) != bare:
        raise ValueError("not base64url: not the canonical encoding of its bytes")
    return data


def check_subject(subject: str) -> str:
    """A VAPID ``sub``: a ``mailto:`` address or an ``https:`` URL (RFC 8292 §2.1)."""
    if _SUBJECT.fullmatch(subject) is None:
        raise ValueError("must be a contact: mailto:someone@example.org or an https:// URL")
    return subject


def origin(endpoint: str) -> str:
    """The origin of a push endpoint (``https://host`` or ``https://host:port``), a JWT's ``aud``."""
    parts = urlsplit(endpoint)
    if not parts.scheme or not parts.hostname:
        raise ValueError(f"not an absolute URL: {endpoint!r}")
    default = {"https": 443, "http": 80}.get(parts.scheme.lower())
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    port = parts.port
    return f"{parts.scheme.lower()}://{host}" + ("" if port in (None, default) else f":{port}")


class VapidKey:
    """The application server's P-256 key pair."""

    def __init__(self, private_key: ec.EllipticCurvePrivateKey) -> None:
        if not isinstance(private_key.curve, ec.SECP256R1):
            raise ValueError("a VAPID key is a P-256 (prime256v1) key")
        self._key = private_key
        self.public_bytes = public_bytes(private_key.public_key())

    def __repr__(self) -> str:  # never the private key
        return f"VapidKey(public={self.public_key_b64url!r})"

    @classmethod
    def generate(cls) -> VapidKey:
        return cls(ec.generate_private_key(ec.SECP256R1()))

    @classmethod
    def parse(cls, text: str) -> VapidKey:
        """A key from PEM (``-----BEGIN PRIVATE KEY-----`` or ``EC PRIVATE KEY``, unencrypted) or
        the base64url of its 32-byte private scalar; a ``ValueError`` saying what is wrong (never
        the key)."""
        text = text.strip()
        if text.startswith("-----BEGIN"):
            try:
                key = load_pem_private_key(text.encode("ascii"), password=None)
            except (ValueError, TypeError, UnicodeEncodeError, UnsupportedAlgorithm):
                raise ValueError("is not an unencrypted PEM private key") from None
            if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
                raise ValueError("must be a P-256 (prime256v1) EC private key")
            return cls(key)
        try:
            scalar = b64url_decode(text)
        except ValueError:
            raise ValueError("must be PEM or the base64url of a 32-byte P-256 private key") from None
        if len(scalar) != 32:
            raise ValueError("must be PEM or the base64url of a 32-byte P-256 private key "
                             f"(it holds {len(scalar)} bytes)")
        value = int.from_bytes(scalar, "big")
        if not 0 < value < _N:
            raise ValueError("is not a P-256 private key (the scalar is out of range)")
        return cls(ec.derive_private_key(value, ec.SECP256R1()))

    @property
    def public_key_b64url(self) -> str:
        """The ``applicationServerKey`` a page subscribes with, and the header's ``k``."""
        return b64url(self.public_bytes)

    @property
    def private_key_b64url(self) -> str:
        """The private scalar as base64url (what ``scheduler vapid-keys`` prints for the setting)."""
        return b64url(self._key.private_numbers().private_value.to_bytes(32, "big"))

    def private_pem(self) -> str:
        return self._key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode("ascii")

    def token(self, endpoint: str, *, subject: str, now: datetime, lifetime: timedelta = LIFETIME) -> str:
        """The ES256 JWT for ``endpoint``'s push service."""
        if not timedelta(0) < lifetime <= MAX_LIFETIME:
            raise ValueError("a VAPID token lives more than 0 and at most 24 hours")
        claims = {"aud": origin(endpoint), "exp": int((now + lifetime).timestamp()), "sub": check_subject(subject)}
        return jwt.encode(claims, self._key, algorithm="ES256", headers={"typ": "JWT"})

    def authorization(self, endpoint: str, *, subject: str, now: datetime, lifetime: timedelta = LIFETIME) -> str:
        """The ``Authorization`` header's value for one request to ``endpoint``."""
        token = self.token(endpoint, subject=subject, now=now, lifetime=lifetime)
        return f"vapid t={token}, k={self.public_key_b64url}"
