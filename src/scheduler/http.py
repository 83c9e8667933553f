"""HTTP plumbing shared by the routes: bounded JSON bodies, validation errors, answers."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

ModelT = TypeVar("ModelT", bound=BaseModel)


class HTTPRefusal(Exception):
    """The request is refused with ``detail`` (any JSON), e.g. the facts contract's 422s."""

    def __init__(self, status_code: int, detail: Any) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes")


def unprocessable(detail: Any) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=422)


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON, refusing more than ``limit`` bytes before reading them all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
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
        raise HTTPException(422, "body is nested too deeply") from exc
    except ValueError as exc:
        # JSONDecodeError and UnicodeDecodeError, but also NaN/Infinity (which jsonb
        # refuses) and integers longer than Python's int-parsing limit: all the sender's.
        raise HTTPException(422, f"body is not valid JSON: {exc}") from exc


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
        raise HTTPException(422, "body must be a JSON object")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        errors = validation_errors(exc)
        summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        raise HTTPException(422, f"invalid body: {summary}") from exc
