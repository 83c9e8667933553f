"""DELIV-2, DELIV-3: what one send's answer means, and the strict ``Retry-After``.

The rules are the issue's: 2xx delivered; 5xx, 408, 429, a timeout, a connection error retried
(honouring ``Retry-After``); any other 4xx undeliverable; a push service's 404/410 gone.
"""

from __future__ import annotations

import email.utils
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.delivery.outcome import (
    EXCERPT_CHARS,
    HttpAnswer,
    classify,
    classify_error,
    excerpt,
    parse_http_date,
    parse_retry_after,
)
from scheduler.types import Delivered, Gone, Retry, Undeliverable

NOW = datetime(2026, 5, 4, 9, 30, tzinfo=UTC)
CAP = 3600.0
PROPERTIES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _classify(status: int, headers: dict[str, str] | None = None, body: bytes = b"", *, push: bool = False) -> object:
    return classify(HttpAnswer(status, headers or {}, body), now=NOW, retry_after_cap=CAP, push=push)


@pytest.mark.clause("DELIV-2")
@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_every_2xx_is_delivered_with_the_status_and_an_excerpt_of_the_answer(status: int) -> None:
    """DELIV-2: a 2xx is ``Delivered``, keeping the provider's status and the start of its answer."""
    assert _classify(status, body=b'{"ok": true}\n') == Delivered(status=status, answer='{"ok": true}')


@pytest.mark.clause("DELIV-2")
@pytest.mark.parametrize("status", [500, 502, 503, 504, 599, 408, 429])
def test_5xx_408_and_429_are_retried(status: int) -> None:
    """DELIV-2: a server error, a request timeout and too many requests are ``Retry``, the status
    and the answer's start in the reason."""
    result = _classify(status, body=b"busy")
    assert result == Retry(reason=f"HTTP {status}: busy", retry_after=None)


@pytest.mark.clause("DELIV-2")
@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 409, 410, 413, 422, 499])
def test_any_other_4xx_is_undeliverable(status: int) -> None:
    """DELIV-2: any other 4xx (a 404 and a 410 too, on a channel that is not push) is
    ``Undeliverable``."""
    assert _classify(status) == Undeliverable(reason=f"HTTP {status}")


@pytest.mark.clause("DELIV-2")
@pytest.mark.parametrize("status", [404, 410])
def test_a_push_services_404_or_410_is_gone(status: int) -> None:
    """DELIV-2: to a push service, 404 and 410 say the subscription is dead: ``Gone``."""
    assert _classify(status, body=b"expired", push=True) == Gone(status=status, reason=f"HTTP {status}: expired")
    assert isinstance(_classify(400, push=True), Undeliverable)  # the other 4xx stay undeliverable


@pytest.mark.clause("DELIV-2")
def test_a_redirect_is_never_followed_and_is_undeliverable_naming_where_it_points() -> None:
    """DELIV-2: a 3xx is ``Undeliverable`` (change the URL), naming its ``Location``."""
    result = _classify(301, {"Location": "https://elsewhere.example/hook"})
    assert isinstance(result, Undeliverable)
    assert "301" in result.reason and "https://elsewhere.example/hook" in result.reason


@pytest.mark.clause("DELIV-2")
@pytest.mark.parametrize(("error", "kind", "said"), [
    (httpx.ConnectTimeout("connect timed out"), Retry, "timeout"),
    (httpx.ReadTimeout("read timed out"), Retry, "timeout"),
    (TimeoutError(), Retry, "timeout"),
    (httpx.ConnectError("connection refused"), Retry, "connection error"),
    (httpx.RemoteProtocolError("server disconnected"), Retry, "connection error"),
    (ConnectionResetError("reset by peer"), Retry, "connection error"),
    (RuntimeError("something else"), Retry, "error"),
    (httpx.UnsupportedProtocol("no such scheme"), Undeliverable, "the URL cannot be used"),
    (httpx.InvalidURL("bad url"), Undeliverable, "the URL cannot be used"),
])
def test_a_timeout_or_a_connection_error_is_retried_and_an_unusable_url_is_undeliverable(
        error: Exception, kind: type, said: str) -> None:
    """DELIV-2: an exception is classified by what it means; the reason names its type."""
    result = classify(error, now=NOW, retry_after_cap=CAP)
    assert isinstance(result, kind) and classify_error(error) == result
    assert isinstance(result, Retry | Undeliverable)
    assert result.reason.startswith(said) and type(error).__name__ in result.reason


@pytest.mark.clause("DELIV-2")
@given(status=st.integers(min_value=0, max_value=1000),
       body=st.binary(max_size=2000), push=st.booleans(),
       retry_after=st.one_of(st.none(), st.text(max_size=40)))
@PROPERTIES
def test_every_status_lands_in_exactly_the_class_its_rule_names(status: int, body: bytes, push: bool,
                                                                  retry_after: str | None) -> None:
    """DELIV-2: for any status, body and ``Retry-After``, the class is the one the rules give,
    a ``Retry``'s wait is within 0 and the cap, and a reason or excerpt is one short printable line."""
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    result = classify(HttpAnswer(status, headers, body), now=NOW, retry_after_cap=CAP, push=push)
    if 200 <= status <= 299:
        expected: type = Delivered
    elif push and status in (404, 410):
        expected = Gone
    elif 500 <= status <= 599 or status in (408, 429) or not 100 <= status <= 599:
        expected = Retry
    else:
        expected = Undeliverable
    assert type(result) is expected
    if isinstance(result, Retry) and result.retry_after is not None:
        assert 0.0 <= result.retry_after <= CAP
    text = result.answer if isinstance(result, Delivered) else result.reason
    assert text.isprintable() and len(excerpt(body)) <= EXCERPT_CHARS


@pytest.mark.clause("DELIV-2")
def test_the_excerpt_is_one_bounded_printable_line_whatever_the_body() -> None:
    """DELIV-2: control characters and line breaks become spaces, a bad UTF-8 byte U+FFFD, and
    a long answer is cut with an ellipsis at ``EXCERPT_CHARS``."""
    assert excerpt(b"line one\r\nline\ttwo\x00\x1b[31m") == "line one line two [31m"
    assert excerpt(b"caf\xc3\xa9 \xff") == "caf\u00e9 \ufffd"
    long = excerpt(b"x" * 10_000)
    assert len(long) == EXCERPT_CHARS and long.endswith("\u2026")


# -- DELIV-3: Retry-After ------------------------------------------------------------------


@pytest.mark.clause("DELIV-3")
def test_a_429_honours_retry_after_in_seconds_and_as_an_http_date() -> None:
    """DELIV-3: ``Retry-After: 7`` is 7 s; an IMF-fixdate 90 s ahead is 90 s; the header's name
    in any case."""
    assert _classify(429, {"Retry-After": "7"}) == Retry(reason="HTTP 429", retry_after=7.0)
    date = email.utils.format_datetime(NOW + timedelta(seconds=90), usegmt=True)
    assert _classify(503, {"retry-after": date}) == Retry(reason="HTTP 503", retry_after=90.0)


@pytest.mark.clause("DELIV-3")
@pytest.mark.parametrize("value", ["Mon, 04 May 2026 09:31:00 GMT", "Monday, 04-May-26 09:31:00 GMT",
                                   "Mon May  4 09:31:00 2026"])
def test_each_of_the_three_http_date_forms_is_read(value: str) -> None:
    """DELIV-3: IMF-fixdate, and the obsolete rfc850 and asctime forms a recipient must accept."""
    assert parse_retry_after(value, now=NOW, cap=CAP) == 60.0


@pytest.mark.clause("DELIV-3")
@pytest.mark.parametrize("value", [
    "", " ", "-5", "+5", "5.5", "1e3", "0x10", "5 s", "\u0663", "\u00b2", "1_000",  # not delay-seconds
    "Mon, 04 May 2026 09:31:00 UTC",  # not GMT
    "mon, 04 May 2026 09:31:00 GMT",  # case
    "Mon,  04 May 2026 09:31:00 GMT",  # spacing
    "Mon, 4 May 2026 09:31:00 GMT",  # a one-digit day in IMF-fixdate
    "Tue, 04 May 2026 09:31:00 GMT",  # a weekday that is not the date's
    "Mon, 31 Feb 2026 09:31:00 GMT",  # no such day
    "Mon, 04 May 2026 24:00:00 GMT",  # no such hour
    "Mon, 04 May 2026 09:31:60 GMT",  # a leap second
    "Mon May 04 09:31:00 2026",  # asctime pads with a space, not a zero
    "2026-05-04T09:31:00Z",  # ISO 8601 is not an HTTP-date
])
def test_a_malformed_retry_after_is_ignored_and_the_backoff_alone_decides(value: str) -> None:
    """DELIV-3: anything that is neither delay-seconds (ASCII digits only) nor an exact
    HTTP-date is None, never an error."""
    assert parse_retry_after(value, now=NOW, cap=CAP) is None


@pytest.mark.clause("DELIV-3")
def test_retry_after_is_capped_a_past_date_is_zero_and_a_megabyte_of_digits_costs_nothing() -> None:
    """DELIV-3: a wait past the cap is the cap (a date or seconds, however many digits: never
    parsed as an integer past the cap's length), a date already past is 0; the header's spaces
    around the value are optional whitespace."""
    assert parse_retry_after("86400", now=NOW, cap=CAP) == CAP
    assert parse_retry_after("9" * 1_000_000, now=NOW, cap=CAP) == CAP
    assert parse_retry_after(" 12\t", now=NOW, cap=CAP) == 12.0
    far = email.utils.format_datetime(NOW + timedelta(days=30), usegmt=True)
    assert parse_retry_after(far, now=NOW, cap=CAP) == CAP
    past = email.utils.format_datetime(NOW - timedelta(days=1), usegmt=True)
    assert parse_retry_after(past, now=NOW, cap=CAP) == 0.0


@pytest.mark.clause("DELIV-3")
def test_a_two_digit_rfc850_year_more_than_50_years_ahead_is_the_century_before() -> None:
    """DELIV-3: RFC 9110 §5.6.7: in 2026, ``-75`` is 2075 and ``-77`` is 1977."""
    assert parse_http_date("Saturday, 04-May-75 09:31:00 GMT", now=NOW) == datetime(2075, 5, 4, 9, 31, tzinfo=UTC)
    assert parse_http_date("Wednesday, 04-May-77 09:31:00 GMT", now=NOW) == datetime(1977, 5, 4, 9, 31, tzinfo=UTC)


@pytest.mark.clause("DELIV-3")
@given(when=st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31),
                         timezones=st.just(UTC)).map(lambda d: d.replace(microsecond=0)))
@PROPERTIES
def test_any_date_written_by_the_standard_library_reads_back_as_itself(when: datetime) -> None:
    """DELIV-3: an IMF-fixdate as ``email.utils`` writes it, and the asctime form as
    ``time.asctime``'s layout writes it, parse to the same instant."""
    assert parse_http_date(email.utils.format_datetime(when, usegmt=True), now=NOW) == when
    asctime = f"{when:%a %b} {when.day:2d} {when:%H:%M:%S %Y}"
    assert parse_http_date(asctime, now=NOW) == when


@pytest.mark.clause("DELIV-3")
@given(value=st.text(max_size=64), cap=st.floats(min_value=0.0, max_value=1e7))
@PROPERTIES
def test_any_retry_after_is_none_or_a_wait_between_zero_and_the_cap(value: str, cap: float) -> None:
    """DELIV-3: whatever a provider sends, the parser answers None or a wait in [0, cap]."""
    wait = parse_retry_after(value, now=NOW, cap=cap)
    assert wait is None or 0.0 <= wait <= cap
    if value.isascii() and value.isdigit() and len(value) <= 12:
        assert wait == min(float(int(value)), cap)
