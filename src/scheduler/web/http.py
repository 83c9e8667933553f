"""HTTP plumbing shared by the routes: bounded JSON bodies, validation errors, answers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from scheduler.digits import digits_value
from scheduler.web.params import (
    Unprocessable as Unprocessable,  # re-exported: the 422 every module raises
)
from scheduler.web.params import text_param

ModelT = TypeVar("ModelT", bound=BaseModel)


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


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON, refusing more than ``limit`` bytes before reading them all."""
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
    raw = b"".join(chunks)
    try:
        return json.loads(raw, parse_constant=_not_json)
    except RecursionError as exc:
        raise Unprocessable.field("body", "is nested too deeply", "body is nested too deeply") from exc
    except ValueError as exc:
        # JSONDecodeError and UnicodeDecodeError, but also NaN/Infinity (which jsonb
        # refuses) and integers longer than Python's int-parsing limit: all the sender's.
        raise Unprocessable.field("body", f"is not valid JSON: {exc}", f"body is not valid JSON: {exc}") from exc


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


def path_param(request: Request, name: str) -> str:
    """A path parameter, bounded and storable (see ``text_param``)."""
    value = str(request.path_params[name])
    text_param(name, value)
    return value
