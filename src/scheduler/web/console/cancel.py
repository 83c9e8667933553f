"""The console's cancel: one row from its page, or every row a filter selects.

Like reset and bulk reset: a CSRF-protected form with a required reason; the filter's
page first shows the dry-run count (pending and failed rows that match), and the action
cancels at most what was counted, in chunks that skip rows a poll holds. The work is done by
the application layer's commands (``commands.cancel``, ``commands.count_matching`` over
``CANCELLABLE``, ``commands.bulk_cancel``): the same ones the API and the CLI run, and they
record every action in the audit trail.
"""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from scheduler.application import commands
from scheduler.web.console.bulk import bulk_action
from scheduler.web.console.sign_in import CSRF_FIELD, ConsoleGuard, console_session, csrf_ok
from scheduler.web.console.view import ConsoleView
from scheduler.web.http.event_filter import EVENT_FILTER, event_query
from scheduler.web.http.params import base_path, declares, path_param, query


def cancel_routes(console: ConsoleView, guard: ConsoleGuard) -> list[Route]:
    """``POST /console/events/{id}/cancel`` and ``GET``/``POST /console/bulk-cancel``."""

    @declares()
    async def cancel_one(request: Request) -> Response:
        """Cancel the row of this page (a reason is required); 409 once it was dispatched."""
        form = await console.form(request)
        session = console_session(request)
        if not csrf_ok(session, _text(form.get(CSRF_FIELD))):
            return console.csrf_refused(request)
        event_id = path_param(request, "event_id")
        reason = _text(form.get("reason")).strip()
        if not reason:
            return console.page(request, "error.html", {"message": "a cancel needs a reason"}, 422)
        actor = commands.Actor(session.subject, "console")
        done = await run_in_threadpool(lambda: commands.cancel(
            console.database, now=console.clock.now(), actor=actor, event_id=event_id, reason=reason))
        if done.outcome == "missing":
            return console.page(request, "error.html", {"message": "no scheduled event with that id"}, 404)
        if done.outcome == "dispatched":
            return console.page(request, "error.html", {
                "message": "already dispatched: a dispatched event cannot be cancelled"}, 409)
        if done.outcome == "expired":
            return console.page(request, "error.html", {
                "message": "already expired: an expired event cannot be cancelled"}, 409)
        outcome = "cancelled" if done.outcome == "cancelled" else "already-cancelled"
        return RedirectResponse(f"{base_path(request)}/console/events/{event_id}?done={outcome}", status_code=303)

    @declares(**EVENT_FILTER)
    async def bulk_page(request: Request) -> Response:
        """The dry run: how many pending or failed rows match the filter, and the form to cancel them."""
        where = event_query(query(request))
        as_of = console.clock.now()
        count = await run_in_threadpool(commands.count_matching, console.database, where, commands.CANCELLABLE)
        return console.page(request, "bulk_cancel.html", {
            "f": where.as_json(), "count": count, "cap": commands.BULK_CAP, "as_of": as_of.isoformat(),
            "filter_query": urlencode(where.as_json()), "error": None, "reason": "",
        })

    @declares()
    async def bulk_cancel(request: Request) -> Response:
        """Cancel what the dry run counted (rows changed since are left alone), with a reason."""
        return await bulk_action(console, request, noun="cancel", form_template="bulk_cancel.html",
                                 done_template="bulk_cancel_done.html", command=commands.bulk_cancel)

    return [
        Route("/console/events/{event_id}/cancel", guard(cancel_one), methods=["POST"]),
        Route("/console/bulk-cancel", guard(bulk_page), methods=["GET"]),
        Route("/console/bulk-cancel", guard(bulk_cancel), methods=["POST"]),
    ]


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
