"""DELIV-12, DELIV-13: a participant's push subscription is parsed strictly, and its endpoint
may only be a public push service: no participant can make the service POST to an internal
address (an IP literal in any spelling, a user name, another port, another host)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduler.delivery.hosts import (
    DEFAULT_ALLOWED,
    DEFAULT_ALLOWED_HOSTS,
    AllowedHosts,
    endpoint_problem,
)
from scheduler.delivery.subscription import SubscriptionRefused, check_endpoint, parse_subscription

PROPERTIES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


# RFC 8291 Appendix A's browser key (published test data): its encoding holds both - and _.
P256DH = "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"
AUTH = b64url(b"0123456789abcdef")


def subscription(**changes: Any) -> dict[str, Any]:
    keys = {"p256dh": P256DH, "auth": AUTH, **changes.pop("keys", {})}
    return {"endpoint": "https://fcm.googleapis.com/fcm/send/dXJ0aGVy:APA91b", "expirationTime": None,
            "keys": keys, **changes}


# -- DELIV-12: the endpoint -------------------------------------------------------------------


@pytest.mark.clause("DELIV-12")
@pytest.mark.parametrize("endpoint", [
    "https://fcm.googleapis.com/fcm/send/cXNzZQ:APA91bG",
    "https://updates.push.services.mozilla.com/wpush/v2/gAAAAABm",
    "https://web.push.apple.com/QGuQyavXutnMaaXlJTd8",
    "https://wns2-by3p.notify.windows.com/w/?token=BQYAAAD",
    "https://fcm.googleapis.com:443/fcm/send/x",
])
def test_the_public_push_services_endpoints_are_allowed_by_default(endpoint: str) -> None:
    """DELIV-12: Chrome's, Firefox's, Safari's and Edge's endpoints (as their documentation
    shows them) pass the default list."""
    assert check_endpoint(endpoint, DEFAULT_ALLOWED) == endpoint


@pytest.mark.clause("DELIV-12")
@pytest.mark.parametrize(("endpoint", "said"), [
    ("http://fcm.googleapis.com/fcm/send/x", "https://"),
    ("HTTPS://fcm.googleapis.com/x", "https://"),
    ("ftp://fcm.googleapis.com/x", "https://"),
    ("https://127.0.0.1/push", "not an IP address"),
    ("https://10.0.0.7/push", "not an IP address"),
    ("https://169.254.169.254/latest/meta-data", "not an IP address"),
    ("https://[::1]/push", "not an IP address"),
    ("https://[fd00::1]:443/push", "not an IP address"),
    ("https://2130706433/push", "not an IP address"),
    ("https://127.1/push", "not an IP address"),
    ("https://0x7f.0.0.1/push", "not an IP address"),
    ("https://user@fcm.googleapis.com/x", "user name or password"),
    ("https://fcm.googleapis.com:x@127.0.0.1/x", "user name or password"),
    ("https://fcm.googleapis.com:8443/x", "port 8443 is not allowed"),
    ("https://fcm.googleapis.com:0/x", "port 0 is not allowed"),
    ("https://fcm.googleapis.com:99999/x", "port 99999 is not allowed"),
    ("https://fcm.googleapis.com.evil.example/x", "not one of the push services"),
    ("https://evilfcm.googleapis.com/x", "not one of the push services"),
    ("https://push.apple.com/x", "not one of the push services"),  # *. matches under it only
    ("https://localhost/push", "two labels"),
    ("https://metadata/computeMetadata", "two labels"),
    ("https://fcm.googleapis.com./x", "a host"),
    ("https://fcm.googleapis.com\\@127.0.0.1/", "printable ASCII"),
    ("https://fcm.googleapis.com/a b", "printable ASCII"),
    ("https://fcm.googleapis.com/\u00e9", "printable ASCII"),
    ("https://fcm.googleapis.com/x#frag", "fragment"),
    ("https://fcm.goo%67leapis.com/x", "a host"),
    ("https:///x", "a host"),
    ("https://fcm.googleapis.com/" + "x" * 2048, "at most 2048"),
])
def test_an_endpoint_off_the_list_or_shaped_to_reach_an_internal_address_is_refused_naming_the_field(
        endpoint: str, said: str) -> None:
    """DELIV-12: the refusal names ``endpoint`` and says why, for the route's 422."""
    with pytest.raises(SubscriptionRefused, match=said) as refused:
        check_endpoint(endpoint, DEFAULT_ALLOWED)
    assert refused.value.field == "endpoint" and refused.value.errors[0]["message"]


@pytest.mark.clause("DELIV-12")
def test_a_deployment_names_its_own_push_services_and_ports() -> None:
    """DELIV-12: ``SCHEDULER_PUSH_ALLOWED_HOSTS`` patterns: a host, ``*.domain``, ``:port``."""
    allowed = AllowedHosts.parse("push.example.org *.push.example.net:8443")
    assert check_endpoint("https://push.example.org/s/1", allowed)
    assert check_endpoint("https://eu.push.example.net:8443/s/1", allowed)
    for refused in ("https://eu.push.example.net/s/1", "https://push.example.org:8443/s/1",
                    "https://fcm.googleapis.com/fcm/send/x"):
        assert endpoint_problem(refused, allowed) is not None, refused
    assert str(allowed) == "push.example.org *.push.example.net:8443"
    assert str(DEFAULT_ALLOWED) == DEFAULT_ALLOWED_HOSTS


@pytest.mark.clause("DELIV-12")
@pytest.mark.parametrize("patterns", ["", "127.0.0.1", "*.com", "com", "*", "fcm.*.com", "a..b", "[::1]",
                                      "host.example:0", "host.example:70000", "host.example:", "http://host.example",
                                      "10.0.0.1:443", "*.10.0.0.1"])
def test_an_allow_list_pattern_that_is_no_host_or_would_allow_an_address_is_refused(patterns: str) -> None:
    """DELIV-12: never an IP address, never a wildcard over a top-level domain, one list of names."""
    with pytest.raises(ValueError):
        AllowedHosts.parse(patterns)


@pytest.mark.clause("DELIV-12")
@given(endpoint=st.one_of(
    st.text(max_size=120),
    st.builds(lambda scheme, host, rest: f"{scheme}://{host}{rest}",
              st.sampled_from(["https", "http", "HTTPS", "https:", ""]),
              st.one_of(st.sampled_from(["fcm.googleapis.com", "web.push.apple.com", "127.0.0.1", "[::1]",
                                         "a.notify.windows.com", "x@fcm.googleapis.com", "fcm.googleapis.com:444"]),
                        st.text(max_size=30)),
              st.text(max_size=40))))
@example("https://[fcm.googleapis.com")  # an unbalanced bracket: urlsplit's own ValueError
@PROPERTIES
def test_any_endpoint_is_refused_or_is_https_on_an_allowed_host_at_443_without_credentials(endpoint: str) -> None:
    """DELIV-12: whatever a participant sends, the check answers (never raises anything else),
    and what it lets through is an https URL on port 443 of a listed host, with no ``@``."""
    from urllib.parse import urlsplit

    problem = endpoint_problem(endpoint, DEFAULT_ALLOWED)
    if problem is None:
        parts = urlsplit(endpoint)
        assert parts.scheme == "https" and "@" not in parts.netloc and parts.port in (None, 443)
        assert parts.hostname is not None and DEFAULT_ALLOWED.allows(parts.hostname)


# -- DELIV-13: the PushSubscription JSON ------------------------------------------------------


@pytest.mark.clause("DELIV-13")
def test_a_browsers_push_subscription_json_parses_to_its_endpoint_and_decoded_keys() -> None:
    """DELIV-13: ``subscription.toJSON()`` as a browser sends it; padded base64url is read too."""
    target = parse_subscription(subscription(), DEFAULT_ALLOWED)
    assert target.endpoint == "https://fcm.googleapis.com/fcm/send/dXJ0aGVy:APA91b"
    assert len(target.p256dh) == 65 and target.p256dh[0] == 4 and target.auth == b"0123456789abcdef"
    padded = parse_subscription(subscription(expirationTime=1_780_000_000_000, keys={"auth": AUTH + "=="}),
                                DEFAULT_ALLOWED)
    assert padded.auth == target.auth


@pytest.mark.clause("DELIV-13")
@pytest.mark.parametrize(("body", "field"), [
    (subscription(endpoint="https://127.0.0.1/push"), "endpoint"),
    (subscription(endpoint=7), "endpoint"),
    ({"keys": {"p256dh": P256DH, "auth": AUTH}}, "endpoint"),
    (subscription(keys={"p256dh": P256DH[:-4]}), "keys.p256dh"),
    (subscription(keys={"p256dh": b64url(b"\x04" + bytes(64))}), "keys.p256dh"),  # not on the curve
    (subscription(keys={"p256dh": b64url(b"\x02" + bytes(32))}), "keys.p256dh"),  # compressed
    (subscription(keys={"p256dh": P256DH.replace("-", "+").replace("_", "/")}), "keys.p256dh"),
    (subscription(keys={"auth": b64url(b"short")}), "keys.auth"),
    (subscription(keys={"auth": "!!!!!!!!!!!!!!!!!!!!!!"}), "keys.auth"),
    (subscription(keys={"auth": AUTH[:-1] + "h"}), "keys.auth"),  # non-canonical trailing bits
    (subscription(keys={"auth": 16}), "keys.auth"),
    (subscription(keys={"extra": "x"}), "keys.extra"),
    (subscription(expirationTime="soon"), "expirationTime"),
    (subscription(expirationTime=-1), "expirationTime"),
    (subscription(expirationTime=True), "expirationTime"),
    (subscription(options={"userVisibleOnly": True}), "options"),
    ({"endpoint": "https://fcm.googleapis.com/x"}, "keys"),
    ([subscription()], "body"),
    ("https://fcm.googleapis.com/x", "body"),
])
def test_a_subscription_that_is_not_exactly_a_push_subscription_is_refused_naming_each_field(
        body: Any, field: str) -> None:
    """DELIV-13: strict types, no extra member, keys of the right size and encoding; each
    refusal names the field (a dotted path) and says why."""
    with pytest.raises(SubscriptionRefused) as refused:
        parse_subscription(body, DEFAULT_ALLOWED)
    assert field in [error["field"] for error in refused.value.errors], refused.value.errors
    assert all(not error["message"].startswith("Value error") for error in refused.value.errors)


@pytest.mark.clause("DELIV-13")
def test_every_wrong_field_of_one_subscription_is_named_at_once() -> None:
    """DELIV-13: a page fixing its subscription sees all that is wrong, not one at a time."""
    body = subscription(endpoint="http://fcm.googleapis.com/x", keys={"p256dh": "x", "auth": "y"})
    with pytest.raises(SubscriptionRefused) as refused:
        parse_subscription(body, DEFAULT_ALLOWED)
    assert sorted(e["field"] for e in refused.value.errors) == ["endpoint", "keys.auth", "keys.p256dh"]


@pytest.mark.clause("DELIV-13")
@given(body=st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                             st.sampled_from(["endpoint", "keys", "p256dh", "auth", "expirationTime", "x"]),
                             inner, max_size=4), max_leaves=12))
@PROPERTIES
def test_any_json_is_a_subscription_or_a_refusal_never_another_error(body: Any) -> None:
    """DELIV-13: whatever JSON a stranger sends, the parser answers a target or
    ``SubscriptionRefused`` naming at least one field (a 422, never a 500)."""
    try:
        parse_subscription(body, DEFAULT_ALLOWED)
    except SubscriptionRefused as refused:
        assert refused.errors and all(e["field"] and e["message"] for e in refused.errors)
