"""Message Encryption for Web Push (RFC 8291) in the ``aes128gcm`` content coding (RFC 8188),
with the ``cryptography`` primitives (DELIV-10).

The application server makes a fresh P-256 key pair and a 16-byte salt per message, agrees
a secret with the browser's ``p256dh`` key (ECDH), mixes in the browser's ``auth`` secret
and both public keys (HKDF-SHA256, as HMACs), derives the content key and nonce from the salt
(RFC 8188 §2.2, §2.3), and seals the payload with its padding delimiter ``0x02`` in one
AES-128-GCM record. The body is the coding's header (salt, record size 4096, the key id:
the server's 65-byte public key) and that record. The salt and the server key are
injectable, so RFC 8291's Appendix A reproduces byte for byte.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

RECORD_SIZE = 4096
SALT_BYTES = 16
AUTH_BYTES = 16
PUBLIC_KEY_BYTES = 65  # an uncompressed P-256 point: 0x04, x, y
TAG_BYTES = 16
HEADER_BYTES = SALT_BYTES + 4 + 1 + PUBLIC_KEY_BYTES  # 86
# A push service must accept 4096 bytes of body (RFC 8030 §7.2): the header, the record's tag
# and the delimiter leave this much for the payload.
MAX_PLAINTEXT_BYTES = 4096 - HEADER_BYTES - TAG_BYTES - 1  # 3993
PADDING_DELIMITER = b"\x02"  # the last (and only) record


def _hmac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


def public_bytes(key: ec.EllipticCurvePublicKey) -> bytes:
    """A P-256 public key as its 65-byte uncompressed point."""
    return key.public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)


def load_public_key(point: bytes) -> ec.EllipticCurvePublicKey:
    """A browser's ``p256dh`` as a key; a ``ValueError`` unless it is an uncompressed point on P-256."""
    if len(point) != PUBLIC_KEY_BYTES or point[0] != 0x04:
        raise ValueError("must be a 65-byte uncompressed P-256 point (0x04, x, y)")
    return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)


def encrypt(plaintext: bytes, ua_public: bytes, auth_secret: bytes, *, salt: bytes | None = None,
            sender_key: ec.EllipticCurvePrivateKey | None = None) -> bytes:
    """The ``aes128gcm`` body of ``plaintext`` for the browser whose ``p256dh`` is ``ua_public``
    and whose ``auth`` is ``auth_secret``. ``salt`` and ``sender_key`` are fresh unless given
    (tests only: reusing them leaks the payloads)."""
    if len(plaintext) > MAX_PLAINTEXT_BYTES:
        raise ValueError(f"a push payload holds at most {MAX_PLAINTEXT_BYTES} bytes, got {len(plaintext)}")
    if len(auth_secret) != AUTH_BYTES:
        raise ValueError(f"the auth secret is {AUTH_BYTES} bytes, got {len(auth_secret)}")
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    if len(salt) != SALT_BYTES:
        raise ValueError(f"the salt is {SALT_BYTES} bytes, got {len(salt)}")
    browser = load_public_key(ua_public)
    sender_key = ec.generate_private_key(ec.SECP256R1()) if sender_key is None else sender_key
    as_public = public_bytes(sender_key.public_key())

    # RFC 8291 §3.3, §3.4: the input keying material from the shared secret and the auth secret
    ecdh_secret = sender_key.exchange(ec.ECDH(), browser)
    prk_key = _hmac(auth_secret, ecdh_secret)
    key_info = b"WebPush: info\x00" + ua_public + as_public
    ikm = _hmac(prk_key, key_info + b"\x01")
    # RFC 8188 §2.2, §2.3: the content-encryption key and the nonce from the salt
    prk = _hmac(salt, ikm)
    cek = _hmac(prk, b"Content-Encoding: aes128gcm\x00\x01")[:16]
    nonce = _hmac(prk, b"Content-Encoding: nonce\x00\x01")[:12]  # record 0: XOR with 0 is itself

    record = AESGCM(cek).encrypt(nonce, plaintext + PADDING_DELIMITER, None)
    header = salt + struct.pack("!I", RECORD_SIZE) + bytes([len(as_public)]) + as_public
    return header + record
