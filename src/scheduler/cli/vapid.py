"""``scheduler vapid-keys``: a new VAPID key pair for the web-push channel (DELIV-16).

It prints the two lines a deployment needs: the private key as the
``SCHEDULER_VAPID_PRIVATE_KEY`` setting (the base64url of its 32 bytes) and the public key
the inbox page subscribes with (``applicationServerKey``, base64url of the 65-byte point).
Nothing is stored, and no database is touched.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduler.config import Settings


def cmd_vapid_keys(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.delivery.vapid import VapidKey  # cryptography: only when the command runs

    key = VapidKey.generate()
    if args.json:
        print(json.dumps({"private_key": key.private_key_b64url, "public_key": key.public_key_b64url}))
    else:
        print(f"SCHEDULER_VAPID_PRIVATE_KEY={key.private_key_b64url}")
        print(f"public key (applicationServerKey): {key.public_key_b64url}")
    return 0
