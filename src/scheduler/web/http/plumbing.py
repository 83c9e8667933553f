"""HTTP plumbing shared by the routes: bounded bodies (JSON and forms), strict path
parameters, validation errors, answers.

``read_body`` is the one place a request body is read: every body, a form's too, is
refused past its limit (413) before anything parses it, whether its size is declared or it
arrives chunked. ``path_param`` is the one place a path parameter is read (DEC-PARAMS).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote_to_bytes

from pydantic import BaseModel, ValidationError
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from scheduler.web.http.params import (
    Unprocessable as Unprocessable,  # re-exported: the 422 every module raises
)
from scheduler.web.http.params import text_param
from scheduler.whole_numbers import digits_value

ModelT = TypeVar("ModelT", bound=BaseModel)

FORM = "application/x-www-form-urlencoded"
MAX_FORM_FIELDS = 100  # the console's largest form has a dozen
_BAD_PERCENT = re.compile(rb"%(?![0-9A-Fa-f]{2})")
# Marks a stray "%" in a strictly decoded path: a lone surrogate that decoding never makes
# (surrogateescape only makes U+DC80..U+DCFF, for bytes that are not UTF-8).
_STRAY_PERCENT = "\udc25"


class HTTPRefusal(Exception):
    """The request is refused with a documented ``detail`` of its own shape: REQ-0063's
    facts-contract 422s. (Other 422s are ``Unprocessable``.)"""

    def __init__(self, status_code: int, detail: Any) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes")


def respond(model: BaseModel | Sequence[BaseModel], status_code: int = 200) -> JSONResponse:
    """The JSON answer built from its response model (or a list of them). Optional fields
    the handler did not set are left out rather than sent as null."""
    if isinstance(model, BaseModel):
        return JSONResponse(model.model_dump(mode="json", exclude_unset=True), status_code=status_code)
    return JSONResponse([item.model_dump(mode="json", exclude_unset=True) for item in model], status_code=status_code)


async def read_body(request: Request, limit: int) -> bytes:
    """The body's bytes, refusing more than ``limit`` (413) before reading them all: at once
    when Content-Length says so, else as soon as the chunks read pass it."""
    declared = request.headers.get("content-length")
    if declared is not None:
        size_declared = digits_value(declared.strip(), 19)
        if size_declared is None:
            raise HTTPException(400, "malformed Content-Length header: expected ASCII digits")
        if size_declared > limit:
            raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON, bounded by ``read_body``."""
    raw = await read_body(request, limit)
    try:
        return json.loads(raw, parse_constant=_not_json)
    except RecursionError as exc:
        raise Unprocessable.field("body", "is nested too deeply", "body is nested too deeply") from exc
    except ValueError as exc:
        # JSONDecodeError and UnicodeDecodeError, but also NaN/Infinity (which jsonb
        # refuses) and integers longer than Python's int-parsing limit: all the sender's.
        raise Unprocessable.field("body", f"is not valid JSON: {exc}", f"body is not valid JSON: {exc}") from exc


async def read_form(request: Request, limit: int) -> FormData:
    """An HTML form's fields (``application/x-www-form-urlencoded``, what every form of the
    console sends), bounded by ``read_body`` and by ``MAX_FORM_FIELDS``; a body of another
    type has no fields; 422 for bytes that are not UTF-8 once percent-decoded."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    raw = await read_body(request, limit)
    if not raw or media_type != FORM:
        return FormData()  # a body of another type holds no field (the form's checks then refuse it)
    try:
        fields = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                           encoding="utf-8", errors="strict", max_num_fields=MAX_FORM_FIELDS)
    except UnicodeDecodeError:
        raise Unprocessable.field("body", "is not valid UTF-8 once percent-decoded",
                                  "form is not valid UTF-8 once percent-decoded") from None
    except ValueError:  # more than MAX_FORM_FIELDS fields
        raise Unprocessable.field("body", f"has more than {MAX_FORM_FIELDS} fields",
                                  f"form has more than {MAX_FORM_FIELDS} fields") from None
    return FormData([(name, value) for name, value in fields])


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def validation_errors(exc: ValidationError) -> list[dict[str, str]]:
    """Pydantic's errors as ``{field, message}``, the field named as a dotted path."""
    errors = []
    for error in exc.errors(include_url=False):
        field = ".".join(str(part) for part in error["loc"]) or "body"
        errors.append({"field": field, "message": error["msg"]})
    return errors


def parse_body(model: type[ModelT], payload: Any) -> ModelT:
    """Validate ``payload``; a malformed body is a 422 naming each offending field."""
    if not isinstance(payload, dict):
        raise Unprocessable.field("body", "must be a JSON object", "body must be a JSON object")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        errors = validation_errors(exc)
        summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        raise Unprocessable(errors, f"invalid body: {summary}") from exc


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
