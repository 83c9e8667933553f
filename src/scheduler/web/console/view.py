"""What every console route renders and reads with: its templates, a posted form, the CSRF
refusal, and the service's database and clock the routes act with.

``ConsoleView`` is the one implementation: ``Console`` (``pages``) is one and mounts every
route; the bulk and cancel routes (``bulk``, ``cancel``) are handed it. Both sides import this
module and neither imports the other back (ARCH-1), so no route module copies the console's
surface to name what it uses.
"""

from __future__ import annotations

from datetime import datetime
from importlib.resources import files
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from scheduler.database.database import Database
from scheduler.operations.overview import duration
from scheduler.types import Clock
from scheduler.web.console.sign_in import CSRF_FIELD
from scheduler.web.http.bodies import read_form
from scheduler.web.http.params import base_path

PACKAGE = Path(str(files("scheduler.web.console")))
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class ConsoleView:
    """The console's rendering and its handles: ``page`` renders a template with the signed-in
    session and its CSRF token, ``form`` reads a posted form bounded by
    ``SCHEDULER_MAX_BODY_BYTES`` (a 413), ``csrf_refused`` is the 403 page; ``database`` and
    ``clock`` are what an action runs with."""

    def __init__(self, database: Database, clock: Clock, *, max_body_bytes: int = 64 * 1024) -> None:
        self.database = database
        self.clock = clock
        self.max_body_bytes = max_body_bytes
        self.env = Environment(loader=FileSystemLoader(PACKAGE / "templates"),
                               autoescape=select_autoescape(default=True), auto_reload=False)
        self.env.filters["duration"] = duration
        self.env.filters["when"] = _when

    def page(self, request: Request, template: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
        session = request.scope.get("console_session")
        html = self.env.get_template(template).render(
            base=base_path(request), session=session, csrf=session.csrf if session else None,
            csrf_field=CSRF_FIELD, **context,
        )
        return HTMLResponse(html, status_code=status, headers=HEADERS)

    async def form(self, request: Request) -> FormData:
        """A posted form, bounded by SCHEDULER_MAX_BODY_BYTES before it is parsed (a 413)."""
        return await read_form(request, self.max_body_bytes)

    def csrf_refused(self, request: Request) -> Response:
        return self.page(request, "error.html",
                         {"message": "missing or wrong CSRF token: reload the page and try again"}, 403)


def _when(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S %Z").strip()
    return str(value)
