"""Strict parsing of what a stranger puts in a URL or a header: the one place it is done (a
body is ``bodies``').

Every route declares its query parameters with ``@declares(name=Param, ...)``; the
declaration validates them before the handler runs, documents them in ``/openapi.json``
and tells the fuzz what to attack. The rules (decisions DEC-PARAMS in specs/decisions.md):

- The query string is decoded strictly: percent-encoding must be ``%`` and two hex digits
  and the bytes valid UTF-8 (Starlette would quietly turn either into U+FFFD).
- An unknown parameter is refused (a misspelt filter must not widen a selection, nor a bulk
  reset); so is a repeated one (which of two values counts differs from one proxy or
  framework to the next).
- An empty value is the same as an absent one: an HTML form sends its empty fields.
- A number is ASCII digits only (``str.isdigit()`` accepts ``²`` and ``٣``, which ``int()``
  then refuses), of bounded length, within the field's bounds: no sign, no space, no ``_``.
- Text is at most ``MAX_STRING`` characters, without NUL, valid Unicode (``check_text``, a
  body's strings' rule too).
- A path parameter is read as strictly, from the raw path (``path_param``).

A malformed request is an ``Unprocessable`` naming every offending field (a 422 in the
project's error shape ``{"detail", "errors": [{"field", "message"}]}``); the console renders
the same refusal as an HTML page.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar
from urllib.parse import unquote_to_bytes

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from scheduler.web.http.answers import ValidationErrorOut
from scheduler.whole_numbers import digits_value

Endpoint = Callable[..., Awaitable[Response]]
E = TypeVar("E", bound=StrEnum)

MAX_STRING = 200
STREAM_ID_DIGITS = 18  # a bigint stream number fits: 10**18 - 1 < 2**63
_BAD_PERCENT = re.compile(rb"%(?![0-9A-Fa-f]{2})")
# Marks a stray "%" in a strictly decoded path: a lone surrogate that decoding never makes
# (surrogateescape only makes U+DC80..U+DCFF, for bytes that are not UTF-8).
_STRAY_PERCENT = "\udc25"


class Unprocessable(Exception):
    """A 422 that names each offending field: ``{"detail": message, "errors": [{field, message}]}``."""

    def __init__(self, errors: list[dict[str, str]], detail: str | None = None) -> None:
        if not errors:
            raise ValueError("an Unprocessable names at least one field")
        self.errors = errors
        self.detail = detail or "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        super().__init__(self.detail)

    @classmethod
    def field(cls, name: str, message: str, detail: str | None = None) -> Unprocessable:
        return cls([{"field": name, "message": message}], detail)

    def body(self) -> ValidationErrorOut:
        return ValidationErrorOut.model_validate({"detail": self.detail, "errors": self.errors})


# -- primitives: one value ------------------------------------------------------------


def whole_number(name: str, raw: str, *, low: int, high: int) -> int:
    """A whole number from ``low`` to ``high``, or a 422 naming ``name``."""
    value = digits_value(raw, len(str(high)))
    if value is None or not low <= value <= high:
        raise Unprocessable.field(name, f"must be a whole number from {low} to {high} (ASCII digits only)")
    return value


def stream_id(name: str, raw: str) -> int:
    """An SSE event id of this service (a stream number), e.g. ``Last-Event-ID``."""
    value = digits_value(raw, STREAM_ID_DIGITS)
    if value is None:
        raise Unprocessable.field(name, f"must be a stream event id (up to {STREAM_ID_DIGITS} ASCII digits)")
    return value


def check_text(value: str) -> None:
    """Text PostgreSQL can store: no NUL, and valid Unicode (no unpaired surrogate)."""
    if "\x00" in value:
        raise ValueError("contains a NUL character (\\u0000), which cannot be stored")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains an unpaired surrogate (\\ud800-\\udfff), which is not valid Unicode") from None


def text_param(name: str, raw: str | None, max_length: int = MAX_STRING) -> str | None:
    """Text the database can compare: bounded, no NUL, valid Unicode; ``None`` stays None."""
    if raw is None:
        return None
    if len(raw) > max_length:
        raise Unprocessable.field(name, f"at most {max_length} characters")
    try:
        check_text(raw)
    except ValueError as exc:
        raise Unprocessable.field(name, str(exc)) from None
    return raw


def choice(name: str, raw: str, values: type[E]) -> E:
    """One of an enum's values, or a 422 listing them."""
    try:
        return values(raw)
    except ValueError:
        expected = ", ".join(values)
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise Unprocessable.field(name, f"unknown value {shown!r}; expected one of {expected}") from None


def timestamp(name: str, raw: str) -> datetime:
    """An ISO 8601 time with a zone (e.g. ``2026-11-30T09:00+00:00``)."""
    text_param(name, raw, max_length=64)
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise Unprocessable.field(name, "not an ISO 8601 time (e.g. 2026-11-30T09:00+00:00)") from None
    if value.tzinfo is None:
        raise Unprocessable.field(name, "give a time zone (e.g. 2026-11-30T09:00+00:00)")
    return value


def time_cursor(name: str, raw: str) -> tuple[datetime, str]:
    """A keyset cursor ``<ISO time>~<id>`` as this API's pages give it in ``next``."""
    text_param(name, raw, max_length=64 + 1 + MAX_STRING)
    at, sep, row_id = raw.partition("~")
    try:
        parsed: datetime | None = datetime.fromisoformat(at)
    except ValueError:
        parsed = None
    if not sep or parsed is None or parsed.tzinfo is None or not row_id:
        raise Unprocessable.field(name, "not a cursor from this API (use the previous page's next)")
    text_param(name, row_id)
    return parsed, row_id


# -- declarations: a route's parameters ---------------------------------------------


@dataclass(frozen=True)
class Param:
    """One declared query parameter: how to parse it, its default, its OpenAPI schema."""

    parse: Callable[[str, str], Any]
    schema: dict[str, Any]
    default: Any = None
    description: str = ""

    @classmethod
    def integer(cls, low: int, high: int, default: int | None = None, description: str = "") -> Param:
        return cls(functools.partial(_whole, low=low, high=high),
                   {"type": "integer", "minimum": low, "maximum": high}, default, description)

    @classmethod
    def string(cls, description: str = "", max_length: int = MAX_STRING) -> Param:
        return cls(functools.partial(_text, max_length=max_length),
                   {"type": "string", "maxLength": max_length}, None, description)

    @classmethod
    def enum(cls, values: type[StrEnum], description: str = "") -> Param:
        return cls(functools.partial(choice, values=values),
                   {"type": "string", "enum": [str(v) for v in values]}, None, description)

    @classmethod
    def time(cls, description: str = "") -> Param:
        return cls(timestamp, {"type": "string", "format": "date-time"}, None, description)

    @classmethod
    def cursor(cls, description: str = "") -> Param:
        return cls(time_cursor, {"type": "string", "maxLength": 64 + 1 + MAX_STRING}, None, description)

    @classmethod
    def stream_id(cls, description: str = "") -> Param:
        return cls(stream_id, {"type": "integer", "minimum": 0, "maximum": 10**STREAM_ID_DIGITS - 1},
                   None, description)

    @classmethod
    def flag(cls, description: str = "") -> Param:
        return cls(_flag, {"type": "string", "enum": ["1", "0", "true", "false"]}, False, description)


def _whole(name: str, raw: str, *, low: int, high: int) -> int:
    return whole_number(name, raw, low=low, high=high)


def _text(name: str, raw: str, *, max_length: int) -> str:
    value = text_param(name, raw, max_length)
    assert value is not None
    return value


def _flag(name: str, raw: str) -> bool:
    if raw not in ("1", "0", "true", "false"):
        raise Unprocessable.field(name, "must be 1, 0, true or false")
    return raw in ("1", "true")


def _decode(name: str, raw: bytes) -> str:
    if _BAD_PERCENT.search(raw):
        raise Unprocessable.field(name, "invalid percent-encoding (% must be followed by two hex digits)")
    try:
        return unquote_to_bytes(raw.replace(b"+", b" ")).decode("utf-8")
    except UnicodeDecodeError:
        raise Unprocessable.field(name, "not valid UTF-8 once percent-decoded") from None


def query_pairs(raw: bytes) -> list[tuple[str, str]]:
    """The query string's name/value pairs, decoded strictly (see the module's rules)."""
    pairs = []
    for part in raw.split(b"&"):
        if not part:
            continue
        raw_name, _, raw_value = part.partition(b"=")
        name = _decode("query", raw_name)
        pairs.append((name, _decode(name if name.isprintable() and len(name) <= 64 else "query", raw_value)))
    return pairs


def parse_query(raw: bytes, declared: Mapping[str, Param]) -> dict[str, Any]:
    """Every declared parameter's value (its default when absent or empty), or an
    ``Unprocessable`` naming each unknown, repeated or malformed parameter."""
    errors: list[dict[str, str]] = []
    given: dict[str, str] = {}
    for name, value in query_pairs(raw):
        shown = name if name.isprintable() and len(name) <= 64 else "query"
        if name not in declared:
            expected = ", ".join(declared) or "none"
            errors.append({"field": shown, "message": f"unknown query parameter; this route takes: {expected}"})
        elif name in given:
            errors.append({"field": name, "message": "given more than once"})
        else:
            given[name] = value
    values: dict[str, Any] = {}
    for name, param in declared.items():
        raw_value = given.get(name, "")
        if raw_value == "":
            values[name] = param.default
            continue
        try:
            values[name] = param.parse(name, raw_value)
        except Unprocessable as exc:
            errors.extend(exc.errors)
    if errors:
        raise Unprocessable(errors)
    return values


@dataclass(frozen=True)
class Query:
    """What ``@declares`` attaches to an endpoint: its declared query parameters."""

    params: Mapping[str, Param] = field(default_factory=dict)


def declares(**params: Param) -> Callable[[Endpoint], Endpoint]:
    """Declare an endpoint's query parameters; the parsed values are ``query(request)``.

    Put it under ``@require`` so a caller without a token hears 401 before any 422. The
    declaration is on the endpoint (``endpoint.query``) for the OpenAPI document and the
    fuzz; a route without one takes no parameter at all."""

    def decorator(endpoint: Endpoint) -> Endpoint:
        @functools.wraps(endpoint)
        async def wrapper(*args: Any) -> Response:
            request = args[-1]  # a plain endpoint gets (request,), a method (self, request)
            assert isinstance(request, Request)
            request.scope["query"] = parse_query(request.scope.get("query_string", b""), params)
            response: Response = await endpoint(*args)
            return response

        wrapper.query = Query(params)  # type: ignore[attr-defined]
        return wrapper

    return decorator


def query(request: Request) -> dict[str, Any]:
    """The parsed query parameters of a ``@declares`` endpoint."""
    values: dict[str, Any] = request.scope["query"]
    return values


def declared(endpoint: Any) -> Mapping[str, Param] | None:
    """An endpoint's declared query parameters; None if it declares none (takes none)."""
    found = getattr(endpoint, "query", None)
    return found.params if isinstance(found, Query) else None


__all__ = [
    "Param",
    "Query",
    "Unprocessable",
    "choice",
    "declared",
    "declares",
    "digits_value",
    "parse_query",
    "query",
    "query_pairs",
    "stream_id",
    "text_param",
    "time_cursor",
    "timestamp",
    "whole_number",
]


# -- the path ------------------------------------------------------------------------------


def base_path(request: Request) -> str:
    """Where the app is mounted (``""`` standalone, ``/nudging`` when embedded): the prefix of
    the links and cookie paths the console and the inbox page give a browser."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def path_param(request: Request, name: str) -> str:
    """A path parameter, parsed as strictly as a query parameter (DEC-PARAMS): its bytes
    percent-decode to UTF-8 (Starlette would turn them into U+FFFD), without a stray
    ``%``, a NUL or another control character, and bounded (see ``text_param``); else a
    422 naming ``name``."""
    value = str(request.path_params[name])
    strict = _strict_value(request, name)
    if strict is not None:
        if _STRAY_PERCENT in strict:
            raise Unprocessable.field(name, "invalid percent-encoding (% must be followed by two hex digits)")
        if any("\udc80" <= c <= "\udcff" for c in strict):
            raise Unprocessable.field(name, "not valid UTF-8 once percent-decoded")
    text_param(name, value)
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise Unprocessable.field(name, "contains a control character")
    return value


def _strict_value(request: Request, name: str) -> str | None:
    """The parameter as the raw path spells it, decoded without losing a byte: bytes that are
    not UTF-8 stay lone surrogates, a stray ``%`` is ``_STRAY_PERCENT``. None where the raw
    path or the route is unknown (then the decoded value is all there is)."""
    raw_path = request.scope.get("raw_path")
    route = request.scope.get("route")
    if not isinstance(raw_path, bytes) or not isinstance(route, Route):
        return None
    raw_path = raw_path.partition(b"?")[0]
    decoded = _STRAY_PERCENT.join(unquote_to_bytes(part).decode("utf-8", "surrogateescape")
                                  for part in _BAD_PERCENT.split(raw_path))
    # The route's own pattern, unanchored at the start: an app mounted under a prefix sees
    # the whole raw path, the route only its own tail.
    match = re.search(route.path_regex.pattern.removeprefix("^"), decoded)
    if match is None or name not in match.groupdict():
        return None
    return match.group(name)
