"""How the service answers what went wrong: one JSON ``detail`` shape for every error.

``EXCEPTION_HANDLERS`` is what the composition root gives Starlette: the documented 4xx
refusals, a database condition the client can wait out (503 with ``Retry-After``, judged by
SQLSTATE in ``WAIT_OUT``), a value the database refused (the sender's 422), a client that
went away mid-body (not an error), and anything else (500, logged by Starlette).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from sqlalchemy.exc import DataError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from scheduler.web.http.answers import ErrorOut, HTTPRefusal, respond
from scheduler.web.http.params import Unprocessable

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5

# Every database condition a client can wait out, by SQLSTATE: a code, or a two-character
# class that stands for all its codes. Such a request is a 503 with Retry-After on every
# route (a sender that retries on 503 then loses nothing); any other database error is a
# 500, or the sender's 422 for a value the database refused (class 22, DataError).
WAIT_OUT: dict[str, str] = {
    "08": "the connection to the database failed",
    "53": "the database is out of a resource (connections, memory, disk)",
    "25006": "the database is read-only (a standby, or a failover under way)",
    "25P03": "the database ended an idle transaction",
    "40001": "a serialization failure",
    "40P01": "a deadlock",
    "55P03": "a lock timeout",
    "57014": "a statement timeout (the query was cancelled)",
    "57P01": "the database is shutting down",
    "57P02": "the database crashed and is restarting",
    "57P03": "the database is starting up",
    "57P05": "the database ended an idle session",
}


def wait_out_reason(exc: DBAPIError) -> str | None:
    """Why a client can retry this database error later, or None if it cannot."""
    if exc.connection_invalidated:
        return "the connection to the database was lost"
    state = getattr(exc.orig, "sqlstate", None)
    if not isinstance(state, str):
        # No answer from the server at all (refused, reset, closed): an outage.
        return "the database cannot be reached" if isinstance(exc, (OperationalError, InterfaceError)) else None
    return WAIT_OUT.get(state) or WAIT_OUT.get(state[:2])


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPRefusal)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def _value_not_storable(exc: DBAPIError) -> Response:
    """A value the database refused (a safety net behind the schemas): the sender's 422."""
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
    """A database error: a 503 if the client can wait it out (``WAIT_OUT``), the sender's
    422 for a value refused, else re-raised (a 500, logged by Starlette)."""
    assert isinstance(exc, DBAPIError)
    reason = wait_out_reason(exc)
    if reason is not None:
        return _unavailable(reason, exc)
    if isinstance(exc, DataError):
        return _value_not_storable(exc)
    raise exc


async def _pool_exhausted(request: Request, exc: Exception) -> Response:
    return _unavailable("no pooled connection came free in time", exc)


def _unavailable(reason: str, exc: Exception) -> Response:
    logger.warning("database unavailable (%s): %s", reason, exc)
    # The answer is the same whatever the reason (senders match on it); the log says which.
    return JSONResponse({"detail": "database unavailable; retry later"}, status_code=503,
                        headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


async def _client_gone(request: Request, exc: Exception) -> Response:
    """The client disconnected before its body was complete: nobody is left to answer, and
    it is not the service's error. (The answer is sent to no one.)"""
    logger.info("client disconnected before the request body was complete: %s %s", request.method, request.url.path)
    return Response(status_code=400)


Handler = Callable[[Request, Exception], Awaitable[Response]]

EXCEPTION_HANDLERS: dict[type[Exception], Handler] = {
    HTTPException: _http_error,
    HTTPRefusal: _refused,
    Unprocessable: _unprocessable,
    Exception: _internal_error,
    PoolTimeout: _pool_exhausted,
    DBAPIError: _database_error,
    ClientDisconnect: _client_gone,
}
