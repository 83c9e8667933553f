"""The console's bulk actions (reset and cancel by filter): one form handler for both.

The filter's page showed a dry-run count at ``as_of``; the POST acts on at most that many
rows, in chunks, with a required reason, through the application layer's command
(``commands.bulk_reset`` or ``commands.bulk_cancel``), which records it in the audit trail.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from scheduler.application import commands, events
from scheduler.database.database import Database
from scheduler.web.console.sign_in import CSRF_FIELD, console_session, csrf_ok
from scheduler.web.console.view import ConsoleView
from scheduler.web.http.params import Unprocessable, whole_number


class BulkCommand(Protocol):
    """``commands.bulk_reset`` and ``commands.bulk_cancel``."""

    def __call__(self, database: Database, query: events.EventQuery, *, now: datetime,
                 as_of: datetime, expected: int, actor: commands.Actor, reason: str) -> commands.BulkResult: ...


async def bulk_action(console: ConsoleView, request: Request, *, noun: str, form_template: str,
                      done_template: str, command: BulkCommand) -> Response:
    """Handle a bulk form's POST: CSRF, the filter, the dry run's ``as_of`` and count, a reason."""
    form = await console.form(request)
    session = console_session(request)
    submitted = form.get(CSRF_FIELD)
    if not csrf_ok(session, submitted if isinstance(submitted, str) else None):
        return console.csrf_refused(request)
    fields = {k: str(v) for k, v in form.items() if k in events.FILTER_FIELDS or k in ("as_of", "expected", "reason")}
    try:
        where = events.EventQuery.from_mapping(fields)
        as_of = events.parse_time("as_of", fields.get("as_of"))
        expected = whole_number("expected", fields.get("expected", ""), low=0, high=2**63 - 1)
    except (events.QueryError, Unprocessable) as exc:
        return console.page(request, "error.html", {"message": f"bad bulk {noun} form: {exc}"}, 422)
    reason = fields.get("reason", "").strip()[:commands.MAX_REASON]
    if as_of is None or not reason:
        return console.page(request, form_template, {
            "f": where.as_json(), "count": expected, "cap": commands.BULK_CAP,
            "as_of": fields.get("as_of", ""), "filter_query": urlencode(where.as_json()),
            "error": f"a bulk {noun} needs a reason", "reason": reason,
        }, 422)
    actor = commands.Actor(session.subject, "console")
    result = await run_in_threadpool(lambda: command(
        console.database, where, now=console.clock.now(), as_of=as_of, expected=expected,
        actor=actor, reason=reason))
    return console.page(request, done_template, {
        "result": result, "expected": expected, "filter_query": urlencode(where.as_json())})
