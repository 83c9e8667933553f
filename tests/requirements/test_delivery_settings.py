"""DELIV-15, DELIV-16: the delivery settings, validated and bounded, secrets never shown; the
built-in channels they turn on; ``scheduler vapid-keys``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime

import httpx
import pytest

from scheduler.config import ConfigError, Settings
from scheduler.core.clock import ManualClock
from scheduler.delivery.channels import (
    allowed_push_hosts,
    built_in_senders,
    retry_policy,
    vapid_key,
)
from scheduler.delivery.hosts import DEFAULT_ALLOWED_HOSTS
from scheduler.delivery.signing import format_secret
from scheduler.delivery.vapid import VapidKey
from scheduler.delivery.webhook import WebhookSender
from scheduler.delivery.webpush import WebPushSender

NOW = datetime(2026, 5, 4, 9, 30, tzinfo=UTC)
SECRET = format_secret(bytes(range(32)))
KEY = VapidKey.generate()


@pytest.mark.clause("DELIV-15")
def test_the_defaults_send_nothing_and_allow_the_public_push_services() -> None:
    """DELIV-15: no webhook, no web push until configured; a 15 s send, 5 s backoff base, 1 h
    cap, 12 attempts, 4 at once; the default push hosts."""
    settings = Settings()
    assert (settings.webhook_url, settings.webhook_secret, settings.vapid_private_key) == (None, None, None)
    assert (settings.delivery_timeout_seconds, settings.delivery_backoff_seconds,
            settings.delivery_backoff_cap_seconds, settings.delivery_max_attempts,
            settings.delivery_concurrency) == (15.0, 5.0, 3600.0, 12, 4)
    assert settings.push_allowed_hosts == DEFAULT_ALLOWED_HOSTS
    assert built_in_senders(settings, client=httpx.AsyncClient(), clock=ManualClock(NOW)) == {}
    assert vapid_key(settings) is None


@pytest.mark.clause("DELIV-15")
@pytest.mark.parametrize(("variable", "value", "said"), [
    ("SCHEDULER_WEBHOOK_URL", "ftp://hooks.example/in", "must be an absolute http:// or https:// URL"),
    ("SCHEDULER_WEBHOOK_URL", "https://user:pw@hooks.example/in", "must not hold a user name or password"),
    ("SCHEDULER_WEBHOOK_URL", "https://hooks.example:99999/in", "absolute http"),
    ("SCHEDULER_WEBHOOK_URL", "hooks.example/in", "absolute http"),
    ("SCHEDULER_PUSH_ALLOWED_HOSTS", "fcm.googleapis.com 10.0.0.1", "never an IP address"),
    ("SCHEDULER_PUSH_ALLOWED_HOSTS", "*.com", "'*.com' is not a host name"),
    ("SCHEDULER_VAPID_SUBJECT", "ops@example.org", "must be a contact: mailto:"),
    ("SCHEDULER_DELIVERY_TIMEOUT_SECONDS", "0", "must be more than 0"),
    ("SCHEDULER_DELIVERY_TIMEOUT_SECONDS", "301", "must be at most 300"),
    ("SCHEDULER_DELIVERY_TIMEOUT_SECONDS", "soon", "must be a number of seconds"),
    ("SCHEDULER_DELIVERY_BACKOFF_SECONDS", "0.01", "must be at least 0.1"),
    ("SCHEDULER_DELIVERY_BACKOFF_CAP_SECONDS", "2", "must be at least SCHEDULER_DELIVERY_BACKOFF_SECONDS (5)"),
    ("SCHEDULER_DELIVERY_BACKOFF_CAP_SECONDS", "604801", "must be at most 604800"),
    ("SCHEDULER_DELIVERY_MAX_ATTEMPTS", "0", "must be at least 1"),
    ("SCHEDULER_DELIVERY_MAX_ATTEMPTS", "101", "must be at most 100"),
    ("SCHEDULER_DELIVERY_CONCURRENCY", "0", "must be at least 1"),
    ("SCHEDULER_DELIVERY_CONCURRENCY", "many", "must be a whole number"),
])
def test_a_malformed_or_out_of_bounds_delivery_setting_is_refused_naming_its_variable(
        variable: str, value: str, said: str) -> None:
    """DELIV-15: each setting is bounded and parsed strictly, the error names the variable."""
    with pytest.raises(ConfigError, match=variable) as refused:
        Settings.from_env({variable: value})
    assert said in str(refused.value)


@pytest.mark.clause("DELIV-15")
@pytest.mark.parametrize(("env", "variable", "said"), [
    ({"SCHEDULER_WEBHOOK_URL": "https://hooks.example/in", "SCHEDULER_WEBHOOK_SECRET": "whsec_c2hvcnQ="},
     "SCHEDULER_WEBHOOK_SECRET", "24 to 64 bytes"),
    ({"SCHEDULER_WEBHOOK_URL": "https://hooks.example/in", "SCHEDULER_WEBHOOK_SECRET": SECRET[6:]},
     "SCHEDULER_WEBHOOK_SECRET", "must start with whsec_"),
    ({"SCHEDULER_WEBHOOK_SECRET": SECRET}, "SCHEDULER_WEBHOOK_SECRET", "SCHEDULER_WEBHOOK_URL is not"),
    ({"SCHEDULER_VAPID_PRIVATE_KEY": KEY.private_key_b64url[:-3], "SCHEDULER_VAPID_SUBJECT": "mailto:a@b.example"},
     "SCHEDULER_VAPID_PRIVATE_KEY", "32-byte P-256 private key"),
    ({"SCHEDULER_VAPID_PRIVATE_KEY": "-----BEGIN PRIVATE KEY-----\n" + KEY.private_key_b64url
      + "\n-----END PRIVATE KEY-----"}, "SCHEDULER_VAPID_PRIVATE_KEY", "not an unencrypted PEM private key"),
    ({"SCHEDULER_VAPID_PRIVATE_KEY": KEY.private_key_b64url}, "SCHEDULER_VAPID_SUBJECT",
     "required with SCHEDULER_VAPID_PRIVATE_KEY"),
])
def test_a_malformed_secret_or_key_is_a_clear_error_that_never_shows_the_value(
        env: dict[str, str], variable: str, said: str) -> None:
    """DELIV-15: the webhook secret (``whsec_`` + base64) and the VAPID key (PEM or base64url)
    are checked when the settings are built; the message says what is wrong and never holds
    the value (it reaches a terminal or a log line)."""
    with pytest.raises(ConfigError, match=variable) as refused:
        Settings.from_env(env)
    message = str(refused.value)
    assert said in message
    assert SECRET[6:20] not in message and KEY.private_key_b64url[:20] not in message


@pytest.mark.clause("DELIV-15")
def test_the_webhook_secret_and_the_vapid_key_stay_out_of_the_settings_repr() -> None:
    """DELIV-15: a log line that prints the settings shows neither secret."""
    settings = Settings(webhook_url="https://hooks.example/in", webhook_secret=SECRET,
                        vapid_private_key=KEY.private_pem(), vapid_subject="mailto:ops@example.org")
    shown = repr(settings)
    assert SECRET[6:20] not in shown and "PRIVATE KEY" not in shown and "https://hooks.example/in" in shown


@pytest.mark.clause("DELIV-15")
def test_the_settings_turn_on_the_webhook_and_web_push_channels_with_their_timeout_and_policy() -> None:
    """DELIV-15: a webhook URL (and secret) makes a signed ``webhook`` sender, a VAPID key and
    subject a ``web_push`` one, both with the per-send timeout and the backoff cap as the most
    of a ``Retry-After``; the retry policy and the push hosts come from their settings too."""
    settings = Settings.from_env({
        "SCHEDULER_WEBHOOK_URL": "https://hooks.example/in", "SCHEDULER_WEBHOOK_SECRET": SECRET,
        "SCHEDULER_VAPID_PRIVATE_KEY": KEY.private_pem(), "SCHEDULER_VAPID_SUBJECT": "https://sunny-street.example",
        "SCHEDULER_DELIVERY_TIMEOUT_SECONDS": "2.5", "SCHEDULER_DELIVERY_BACKOFF_SECONDS": "1",
        "SCHEDULER_DELIVERY_BACKOFF_CAP_SECONDS": "90", "SCHEDULER_DELIVERY_MAX_ATTEMPTS": "3",
        "SCHEDULER_PUSH_ALLOWED_HOSTS": "push.example.org"})
    senders = built_in_senders(settings, client=httpx.AsyncClient(), clock=ManualClock(NOW))
    webhook, push = senders["webhook"], senders["web_push"]
    assert isinstance(webhook, WebhookSender) and isinstance(push, WebPushSender)
    assert webhook.url == "https://hooks.example/in" and webhook.signed
    assert (webhook.timeout, webhook.retry_after_cap, push.timeout, push.retry_after_cap) == (2.5, 90.0, 2.5, 90.0)
    assert push.vapid.public_key_b64url == KEY.public_key_b64url and push.subject == "https://sunny-street.example"
    policy = retry_policy(settings)
    assert (policy.base_seconds, policy.cap_seconds, policy.max_attempts) == (1.0, 90.0, 3)
    assert allowed_push_hosts(settings).allows("push.example.org")
    assert not allowed_push_hosts(settings).allows("fcm.googleapis.com")


# -- DELIV-16: scheduler vapid-keys ----------------------------------------------------------


@pytest.mark.clause("DELIV-16")
def test_vapid_keys_prints_a_private_key_the_settings_accept_and_its_public_key_for_the_page() -> None:
    """DELIV-16: the first line is a ``SCHEDULER_VAPID_PRIVATE_KEY=`` the settings accept, the
    second the matching base64url public key; ``--json`` gives both; every run a new pair."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_") and k != "DATABASE_URL"}
    runs = [subprocess.run([sys.executable, "-m", "scheduler", "vapid-keys", *extra], capture_output=True, text=True,
                           env=env, timeout=120) for extra in ([], ["--json"])]
    assert [run.returncode for run in runs] == [0, 0], [run.stderr for run in runs]
    first, second = runs[0].stdout.splitlines()
    private = first.removeprefix("SCHEDULER_VAPID_PRIVATE_KEY=")
    public = second.removeprefix("public key (applicationServerKey): ")
    settings = Settings.from_env({"SCHEDULER_VAPID_PRIVATE_KEY": private,
                                  "SCHEDULER_VAPID_SUBJECT": "mailto:a@b.example"})
    key = vapid_key(settings)
    assert key is not None and key.public_key_b64url == public
    pair = json.loads(runs[1].stdout)
    assert VapidKey.parse(pair["private_key"]).public_key_b64url == pair["public_key"] != public


@pytest.mark.clause("DELIV-15")
def test_a_channel_built_from_the_settings_sends_with_them() -> None:
    """DELIV-15: the settings' webhook sender really posts to the URL, signed with the secret
    the local receiver holds."""
    from scheduler.testing.webhook_receiver import LocalWebhookReceiver
    from scheduler.types import Delivered, OutboundDelivery

    clock = ManualClock(NOW)

    async def scenario() -> None:
        async with LocalWebhookReceiver(SECRET, clock=clock) as receiver, httpx.AsyncClient() as client:
            settings = Settings.from_env({"SCHEDULER_WEBHOOK_URL": receiver.url, "SCHEDULER_WEBHOOK_SECRET": SECRET})
            sender = built_in_senders(settings, client=client, clock=clock)["webhook"]
            sent = OutboundDelivery(delivery_id="d", idempotency_key="k-1", channel="webhook", notification_id="n",
                                    user_id="u", community_id=None, kind="k", title="t", body="b", created_at=NOW)
            assert await sender.send(sent) == Delivered(status=204, answer="")
            assert [got.accepted for got in receiver.received] == [True]

    asyncio.run(asyncio.wait_for(scenario(), 30))
