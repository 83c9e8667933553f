"""How the service answers what went wrong: one JSON ``detail`` shape for every error.

``EXCEPTION_HANDLERS`` is what the composition root gives Starlette: the documented 4xx
refusals, a database that cannot be reached (503 with ``Retry-After``), a value the
database refused (the sender's 422), and anything else (500, logged by Starlette).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from sqlalchemy.exc import DataError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from scheduler.web.http import HTTPRefusal, Unprocessable, respond
from scheduler.web.schemas import ErrorOut

logger = logging.getLogger(__name__)


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPRefusal)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


async def _value_not_storable(request: Request, exc: Exception) -> Response:
    """A value the database refused (a safety net behind the schemas): the sender's 422."""
    assert isinstance(exc, DBAPIError)
    logger.warning("database refused a value: %s", exc.orig)
    first_line = str(exc.orig).splitlines()[0] if exc.orig is not None else "invalid value"
    refusal = Unprocessable.field("body", f"a value cannot be stored: {first_line}",
                                  f"a value cannot be stored: {first_line}")
    return respond(refusal.body(), 422)


async def _unprocessable(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Unprocessable)
    return respond(exc.body(), 422)


async def _internal_error(request: Request, exc: Exception) -> Response:
    """An unexpected error is still a JSON ``detail`` (Starlette logs and re-raises it)."""
    return respond(ErrorOut(detail="internal server error"), 500)


async def _database_error(request: Request, exc: Exception) -> Response:
    """A connection the pool found dead (a restart, a terminated backend) is an outage: 503."""
    assert isinstance(exc, DBAPIError)
    if exc.connection_invalidated:
        return await _database_unavailable(request, exc)
    raise exc


async def _database_unavailable(request: Request, exc: Exception) -> Response:
    logger.warning("database unavailable: %s", exc)
    return JSONResponse(
        {"detail": "database unavailable; retry later"}, status_code=503, headers={"Retry-After": "5"}
    )


Handler = Callable[[Request, Exception], Awaitable[Response]]

EXCEPTION_HANDLERS: dict[type[Exception], Handler] = {
    HTTPException: _http_error,
    HTTPRefusal: _refused,
    Unprocessable: _unprocessable,
    Exception: _internal_error,
    OperationalError: _database_unavailable,
    InterfaceError: _database_unavailable,
    PoolTimeout: _database_unavailable,
    DataError: _value_not_storable,
    DBAPIError: _database_error,
}
