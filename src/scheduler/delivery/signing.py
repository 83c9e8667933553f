"""Standard Webhooks signatures (https://www.standardwebhooks.com, spec 1.0.0; DELIV-8).

The symmetric scheme: a secret is ``whsec_`` and the standard base64 of 24 to 64 random
bytes; the signed content is ``{webhook-id}.{webhook-timestamp}.{body}`` (the body's exact
bytes); a signature is ``v1,`` and the standard base64 of its HMAC-SHA256. The
``webhook-signature`` header is a space-separated list of signatures (several during a
secret's rotation); a receiver accepts the message when any ``v1`` one matches, compared in
constant time, and the timestamp is within its tolerance of its clock (five minutes, as the
reference libraries). The id and the timestamp never contain a ``.``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Mapping
from datetime import datetime

from scheduler.whole_numbers import digits_value

PREFIX = "whsec_"
MIN_SECRET_BYTES = 24  # the spec: at least 24 bytes (192 bits), at most 512 bits
MAX_SECRET_BYTES = 64
TOLERANCE_SECONDS = 300
SIGNATURE_VERSION = "v1"
ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER = "webhook-id", "webhook-timestamp", "webhook-signature"
# A message id: printable ASCII without spaces, commas or full stops, at most 256 characters.
_MESSAGE_ID = re.compile(r"[!-+\-/-~]{1,256}")
_TIMESTAMP_DIGITS = 12


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """Header ``name``, matched case-insensitively (a receiver's framework may keep any case)."""
    return next((value for key, value in headers.items() if key.lower() == name), None)


class WebhookVerificationError(Exception):
    """The message is not proved to be from the holder of the secret; the text says why."""


def parse_secret(text: str) -> bytes:
    """The key of a ``whsec_`` secret, or a ``ValueError`` saying what is wrong (never the value)."""
    if not text.startswith(PREFIX):
        raise ValueError(f"must start with {PREFIX} (a Standard Webhooks secret)")
    try:
        key = base64.b64decode(text[len(PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"must be {PREFIX} followed by standard base64 (A-Z a-z 0-9 + /, padded with =)") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ValueError(f"must hold {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes after {PREFIX}, "
                         f"it holds {len(key)}")
    return key


def format_secret(key: bytes) -> str:
    """A key as the ``whsec_`` text a receiver is given."""
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ValueError(f"a secret holds {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes, got {len(key)}")
    return PREFIX + base64.b64encode(key).decode("ascii")


def _check_id(message_id: str) -> None:
    if _MESSAGE_ID.fullmatch(message_id) is None:
        raise ValueError("a webhook-id is 1 to 256 printable ASCII characters without space, comma or full stop")


def sign(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``v1,<base64>`` signature of ``body`` sent as ``message_id`` at ``timestamp``."""
    _check_id(message_id)
    if timestamp < 0:
        raise ValueError(f"a webhook-timestamp is seconds since the epoch, got {timestamp}")
    mac = hmac.new(key, f"{message_id}.{timestamp}.".encode("ascii") + body, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(mac).decode('ascii')}"


def sign_headers(key: bytes | None, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of a message (``webhook-signature`` only with a key)."""
    _check_id(message_id)
    headers = {ID_HEADER: message_id, TIMESTAMP_HEADER: str(timestamp)}
    if key is not None:
        headers[SIGNATURE_HEADER] = sign(key, message_id, timestamp, body)
    return headers


def verify(secret: bytes | str, headers: Mapping[str, str], body: bytes, *, now: datetime,
           tolerance_seconds: float = TOLERANCE_SECONDS) -> None:
    """Return when ``body`` with ``headers`` is signed by ``secret`` (a key, or its ``whsec_``
    text) within ``tolerance_seconds`` of ``now``; raise ``WebhookVerificationError`` otherwise.
    Signatures of other versions in the list are skipped, as the spec says."""
    key = parse_secret(secret) if isinstance(secret, str) else secret
    message_id = _header(headers, ID_HEADER)
    stamp = _header(headers, TIMESTAMP_HEADER)
    listed = _header(headers, SIGNATURE_HEADER)
    for name, value in ((ID_HEADER, message_id), (TIMESTAMP_HEADER, stamp), (SIGNATURE_HEADER, listed)):
        if not value:
            raise WebhookVerificationError(f"missing header {name}")
    assert message_id is not None and stamp is not None and listed is not None
    if _MESSAGE_ID.fullmatch(message_id) is None:
        raise WebhookVerificationError(f"malformed {ID_HEADER}")
    timestamp = digits_value(stamp, _TIMESTAMP_DIGITS)
    if timestamp is None:
        raise WebhookVerificationError(f"malformed {TIMESTAMP_HEADER}: not whole seconds since the epoch")
    age = now.timestamp() - timestamp
    if age > tolerance_seconds:
        raise WebhookVerificationError(f"{TIMESTAMP_HEADER} too old ({age:.0f} s)")
    if -age > tolerance_seconds:
        raise WebhookVerificationError(f"{TIMESTAMP_HEADER} too far in the future ({-age:.0f} s)")
    expected = hmac.new(key, f"{message_id}.{stamp}.".encode("ascii") + body, hashlib.sha256).digest()
    for entry in listed.split(" "):
        version, comma, encoded = entry.partition(",")
        if version != SIGNATURE_VERSION or not comma:
            continue
        try:
            given = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        if hmac.compare_digest(given, expected):
            return
    raise WebhookVerificationError("no signature matches")
