"""Where a push subscription's endpoint may point (DELIV-12): the host allow-list
(``SCHEDULER_PUSH_ALLOWED_HOSTS``) and the one check of an endpoint URL, which ``PUT
/me/push-subscriptions`` runs through ``subscription.parse_subscription``.

A participant chooses the endpoint, and the service will POST to it: so it must be an
``https`` URL on a push service's host (by default the public ones: Google's FCM, Mozilla's
autopush, Apple's and Windows' push services), on port 443 unless a pattern names another,
with no user name or password, no fragment, never an IP address (in any spelling), so that no
participant can make the service call an internal address.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

# The public push services, each from its own documentation: Chrome's subscriptions are on
# fcm.googleapis.com, Firefox's on updates.push.services.mozilla.com, Safari's on hosts under
# push.apple.com (Apple: allow *.push.apple.com; web.push.apple.com today), Edge's on hosts
# under notify.windows.com (WNS).
DEFAULT_ALLOWED_HOSTS = "fcm.googleapis.com updates.push.services.mozilla.com *.push.apple.com *.notify.windows.com"
MAX_ENDPOINT_CHARS = 2048
HTTPS_PORT = 443

_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})+", re.ASCII)
_PATTERN = re.compile(r"(?P<wild>\*\.)?(?P<host>[^:*]+)(?::(?P<port>\d{1,5}))?", re.ASCII)
_NETLOC = re.compile(r"(?P<host>[A-Za-z0-9.-]+)(?::(?P<port>\d{1,5}))?", re.ASCII)


def _is_name(host: str) -> bool:
    """A DNS name of two labels or more whose last label is not all digits (never an IPv4
    address in any of its spellings, ``127.1`` or ``0x7f.0.0.1``)."""
    return _HOSTNAME.fullmatch(host) is not None and not host.rsplit(".", 1)[-1].isdigit()


@dataclass(frozen=True)
class HostPattern:
    """A host (``fcm.googleapis.com``), or with ``*.`` every host under it (``*.push.apple.com``
    matches ``web.push.apple.com``, not ``push.apple.com``), on port 443 or the one it names."""

    host: str
    wildcard: bool = False
    port: int = HTTPS_PORT

    def matches(self, host: str, port: int) -> bool:
        if port != self.port:
            return False
        return host.endswith("." + self.host) if self.wildcard else host == self.host

    def __str__(self) -> str:
        shown = ("*." if self.wildcard else "") + self.host
        return shown if self.port == HTTPS_PORT else f"{shown}:{self.port}"


@dataclass(frozen=True)
class AllowedHosts:
    """The push services a subscription's endpoint may name (``SCHEDULER_PUSH_ALLOWED_HOSTS``)."""

    patterns: tuple[HostPattern, ...]

    @classmethod
    def parse(cls, text: str) -> AllowedHosts:
        """Space-separated patterns, ``host``, ``*.domain`` or either with ``:port``; at least one.
        A ``ValueError`` names the first that is not one (an IP address, a single label, so no
        wildcard over a top-level domain, a wildcard anywhere but in front)."""
        words = text.split()
        if not words:
            raise ValueError("must name at least one push service host")
        patterns = []
        for word in words:
            match = _PATTERN.fullmatch(word.lower())
            host = match["host"] if match else ""
            if match is None or not _is_name(host):
                raise ValueError(f"{word!r} is not a host name, *.domain, or either with :port (never an IP address)")
            port = int(match["port"]) if match["port"] else HTTPS_PORT
            if not 1 <= port <= 65535:
                raise ValueError(f"{word!r}: the port must be 1 to 65535")
            patterns.append(HostPattern(host, bool(match["wild"]), port))
        return cls(tuple(patterns))

    def allows(self, host: str, port: int = HTTPS_PORT) -> bool:
        return any(pattern.matches(host, port) for pattern in self.patterns)

    def __str__(self) -> str:
        return " ".join(str(p) for p in self.patterns)


DEFAULT_ALLOWED = AllowedHosts.parse(DEFAULT_ALLOWED_HOSTS)


def endpoint_problem(endpoint: str, allowed: AllowedHosts) -> str | None:
    """Why ``endpoint`` may not be a push endpoint here, or None when it may."""
    if len(endpoint) > MAX_ENDPOINT_CHARS:
        return f"must be at most {MAX_ENDPOINT_CHARS} characters"
    if not endpoint.isascii() or not endpoint.isprintable() or any(c in endpoint for c in " \\\t"):
        return "must be a URL of printable ASCII without spaces or backslashes"
    try:
        parts = urlsplit(endpoint)
    except ValueError:  # an unbalanced bracket ("Invalid IPv6 URL")
        return "must name a host (letters, digits, hyphens and dots), with an optional :port"
    if parts.scheme != "https" or not endpoint.startswith("https://"):
        return "must be an https:// URL"
    if "@" in parts.netloc:
        return "must not hold a user name or password"
    if parts.fragment or "#" in endpoint:
        return "must not have a fragment"
    if parts.netloc.startswith("["):
        return _NOT_AN_IP
    netloc = _NETLOC.fullmatch(parts.netloc)
    if netloc is None:
        return "must name a host (letters, digits, hyphens and dots), with an optional :port"
    host = netloc["host"].lower()
    if _looks_like_ip(host):
        return _NOT_AN_IP
    if not _is_name(host):
        return "must name a host of two labels or more"
    port = int(netloc["port"]) if netloc["port"] else HTTPS_PORT
    if not allowed.allows(host, port):
        if port != HTTPS_PORT and allowed.allows(host):
            return f"port {port} is not allowed for {host}"
        return f"{host} is not one of the push services this service sends to"
    return None


_NOT_AN_IP = "must name a push service's host, not an IP address"


def _looks_like_ip(host: str) -> bool:
    """An IPv4 or IPv6 address, or a name whose last label is all digits (``127.1``, the
    ``0x7f.0.0.1`` that ``inet_aton`` reads as an address)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host.rsplit(".", 1)[-1].isdigit()
    return True
