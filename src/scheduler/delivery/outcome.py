"""What one send's answer means (DELIV-2, DELIV-3): an HTTP status with its headers and body,
or the exception the send raised, classified as a ``SendResult``.

- 2xx: ``Delivered``, with the status and a short excerpt of the answer;
- 5xx, 408, 429, any status outside 100-599, a timeout, a connection error, any other
  exception: ``Retry``, with the provider's ``Retry-After`` (seconds or an HTTP date, parsed
  strictly, capped) when a status carried one;
- a push service's 404 or 410: ``Gone`` (the subscription is dead);
- any other 4xx, a redirect (3xx: never followed), a URL the client cannot use, a 1xx as a
  final answer: ``Undeliverable``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx

from scheduler.types import Delivered, Gone, Retry, SendResult, Undeliverable
from scheduler.whole_numbers import ASCII_DIGITS, digits_value

EXCERPT_CHARS = 200  # what a record keeps of a provider's answer
RETRY_STATUSES = frozenset({408, 429})
PUSH_GONE_STATUSES = frozenset({404, 410})
# More digits than this in a Retry-After is longer than any cap: it is the cap, unparsed.
_RETRY_AFTER_DIGITS = 12


@dataclass(frozen=True)
class HttpAnswer:
    """A provider's answer as the classification reads it: the status, the headers (any
    mapping; names are matched case-insensitively) and the start of the body."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


def classify(answer: HttpAnswer | Exception, *, now: datetime, retry_after_cap: float,
             push: bool = False) -> SendResult:
    """The ``SendResult`` of one answer or one exception (the module's rules). ``now`` judges
    a ``Retry-After`` date; ``retry_after_cap`` bounds it; ``push`` makes 404/410 ``Gone``."""
    if isinstance(answer, Exception):
        return classify_error(answer)
    status, text = answer.status, excerpt(answer.body)
    said = f"HTTP {status}: {text}" if text else f"HTTP {status}"
    if 200 <= status <= 299:
        return Delivered(status=status, answer=text)
    if push and status in PUSH_GONE_STATUSES:
        return Gone(status=status, reason=said)
    if 500 <= status <= 599 or status in RETRY_STATUSES or not 100 <= status <= 599:
        wait = parse_retry_after(header(answer.headers, "retry-after"), now=now, cap=retry_after_cap)
        return Retry(reason=said, retry_after=wait)
    if 300 <= status <= 399:
        location = header(answer.headers, "location")
        shown = f" to {excerpt(location.encode())}" if location else ""
        return Undeliverable(reason=f"{said} (a redirect{shown}, not followed: change the URL)")
    return Undeliverable(reason=said)


def classify_error(exc: Exception) -> SendResult:
    """The ``SendResult`` of a send that raised ``exc`` (``classify``'s rules for exceptions)."""
    named = _describe(exc)
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return Undeliverable(reason=f"the URL cannot be used: {named}")
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return Retry(reason=f"timeout: {named}")
    if isinstance(exc, httpx.TransportError | OSError):
        return Retry(reason=f"connection error: {named}")
    return Retry(reason=f"error: {named}")


def _describe(exc: Exception) -> str:
    message = excerpt(str(exc).encode())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def header(headers: Mapping[str, str], name: str) -> str | None:
    """The value of header ``name`` (case-insensitive), or None."""
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return None


def excerpt(body: bytes, limit: int = EXCERPT_CHARS) -> str:
    """The start of an answer as one printable line: decoded as UTF-8 (a bad byte is U+FFFD),
    every character that is not printable (controls, line breaks, bidi overrides, private use)
    and every run of whitespace as one space, at most ``limit`` characters."""
    text = body[: limit * 4].decode("utf-8", "replace")
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


# -- Retry-After (RFC 9110 §10.2.3): delay-seconds or an HTTP-date -------------------------

_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_LONG_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_TIME = r"(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
_MONTH = "(?P<mo>" + "|".join(_MONTHS) + ")"
# IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
_IMF = re.compile(r"(?P<wd>" + "|".join(_DAYS) + r"), (?P<d>\d\d) " + _MONTH + r" (?P<y>\d{4}) " + _TIME + " GMT",
                  re.ASCII)
# rfc850-date (obsolete): Sunday, 06-Nov-94 08:49:37 GMT
_RFC850 = re.compile(r"(?P<wd>" + "|".join(_LONG_DAYS) + r"), (?P<d>\d\d)-" + _MONTH + r"-(?P<y>\d\d) " + _TIME
                     + " GMT", re.ASCII)
# asctime-date (obsolete): Sun Nov  6 08:49:37 1994
_ASCTIME = re.compile(r"(?P<wd>" + "|".join(_DAYS) + ") " + _MONTH + r" (?P<d>[ \d]\d) " + _TIME + r" (?P<y>\d{4})",
                      re.ASCII)


def parse_http_date(text: str, *, now: datetime) -> datetime | None:
    """An HTTP-date in any of its three forms (a recipient must accept all three), matched
    whole and exactly (case, spaces, a weekday that is the date's own), as an aware UTC
    datetime; None for anything else. ``now`` places a two-digit rfc850 year: one more than
    50 years ahead is the century before (RFC 9110 §5.6.7)."""
    for form, weekdays in ((_IMF, _DAYS), (_RFC850, _LONG_DAYS), (_ASCTIME, _DAYS)):
        match = form.fullmatch(text)
        if match is None:
            continue
        year = int(match["y"])
        if form is _RFC850:
            this_year = now.year
            year += this_year - this_year % 100
            if year > this_year + 50:
                year -= 100
        day = match["d"]
        if day.startswith(" "):
            day = day[1:]
        elif form is _ASCTIME and day.startswith("0"):
            return None  # asctime pads a one-digit day with a space, never a zero
        try:
            when = datetime(year, _MONTHS.index(match["mo"]) + 1, int(day),
                            int(match["h"]), int(match["mi"]), int(match["s"]), tzinfo=UTC)
        except ValueError:  # 31 Feb, 25:00, a leap second
            return None
        return when if weekdays[when.weekday()] == match["wd"] else None
    return None


def parse_retry_after(value: str | None, *, now: datetime, cap: float) -> float | None:
    """A ``Retry-After`` value as seconds from ``now``, at most ``cap``: delay-seconds (ASCII
    digits only) or an HTTP-date (a date already past is 0). None when absent or malformed:
    the backoff alone decides then."""
    if value is None:
        return None
    text = value.strip(" \t")
    if text and ASCII_DIGITS.issuperset(text):
        seconds = digits_value(text, _RETRY_AFTER_DIGITS)
        return cap if seconds is None else min(float(seconds), cap)
    when = parse_http_date(text, now=now)
    if when is None:
        return None
    return min(max(0.0, (when - now).total_seconds()), cap)
