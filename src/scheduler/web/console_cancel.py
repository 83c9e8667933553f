"""The console's cancel (issue 17 §4): one row from its page, or every row a filter selects.

Like reset and bulk reset: a CSRF-protected form with a required reason; the filter's
page first shows the dry-run count (pending and failed rows that match), and the action
cancels at most what was counted, in chunks that skip rows a poll holds. The work is done by
``scheduler.application.cancel``, which records every action in the audit trail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from scheduler.application import audit, cancel
from scheduler.web.console_auth import CSRF_FIELD, base_path, console_session, csrf_ok

if TYPE_CHECKING:
    from scheduler.web.console import Console, ConsoleGuard


def cancel_routes(console: Console, guard: ConsoleGuard) -> list[Route]:
    """``POST /console/events/{id}/cancel`` and ``GET``/``POST /console/bulk-cancel``."""

    async def cancel_one(request: Request) -> Response:
        """Cancel the row of this page (a reason is required); 409 once it was dispatched."""
        form = await request.form()
        session = console_session(request)
        if not csrf_ok(session, _text(form.get(CSRF_FIELD))):
            return console.csrf_refused(request)
        event_id = str(request.path_params["event_id"])
        reason = _text(form.get("reason")).strip()
        if not reason:
            return console.page(request, "error.html", {"message": "a cancel needs a reason"}, 422)
        done = await run_in_threadpool(lambda: cancel.cancel_one(
            console.sessions, event_id, console.clock.now(), actor=session.subject, source="console", reason=reason))
        if done.outcome == "missing":
            return console.page(request, "error.html", {"message": "no scheduled event with that id"}, 404)
        if done.outcome == "dispatched":
            return console.page(request, "error.html", {
                "message": "already dispatched: a dispatched event cannot be cancelled"}, 409)
        outcome = "cancelled" if done.outcome == "cancelled" else "already-cancelled"
        return RedirectResponse(f"{base_path(request)}/console/events/{event_id}?done={outcome}", status_code=303)

    async def bulk_page(request: Request) -> Response:
        """The dry run: how many pending or failed rows match the filter, and the form to cancel them."""
        try:
            where = audit.EventFilter.from_mapping(request.query_params)
        except audit.FilterError as exc:
            return console.page(request, "error.html", {"message": str(exc)}, 422)
        as_of = console.clock.now()
        count = await run_in_threadpool(cancel.count_cancellable, console.sessions, where)
        return console.page(request, "bulk_cancel.html", {
            "f": where.as_json(), "count": count, "cap": audit.BULK_CAP, "as_of": as_of.isoformat(),
            "filter_query": urlencode(where.as_json()), "error": None, "reason": "",
        })

    async def bulk_cancel(request: Request) -> Response:
        """Cancel what the dry run counted (rows changed since are left alone), with a reason."""
        form = await request.form()
        session = console_session(request)
        if not csrf_ok(session, _text(form.get(CSRF_FIELD))):
            return console.csrf_refused(request)
        fields = {k: str(v) for k, v in form.items()}
        try:
            where = audit.EventFilter.from_mapping(fields)
            as_of = audit.parse_time("as_of", fields.get("as_of"))
            expected = int(fields.get("expected", ""))
        except (audit.FilterError, ValueError) as exc:
            return console.page(request, "error.html", {"message": f"bad bulk cancel form: {exc}"}, 422)
        reason = fields.get("reason", "").strip()[:2000]
        if as_of is None or not reason:
            return console.page(request, "bulk_cancel.html", {
                "f": where.as_json(), "count": expected, "cap": audit.BULK_CAP,
                "as_of": fields.get("as_of", ""), "filter_query": urlencode(where.as_json()),
                "error": "a bulk cancel needs a reason", "reason": reason,
            }, 422)
        result = await run_in_threadpool(lambda: cancel.bulk_cancel(
            console.sessions, where, now=console.clock.now(), as_of=as_of, expected=expected,
            actor=session.subject, source="console", reason=reason))
        return console.page(request, "bulk_cancel_done.html", {
            "result": result, "expected": expected, "filter_query": urlencode(where.as_json())})

    return [
        Route("/console/events/{event_id}/cancel", guard(cancel_one), methods=["POST"]),
        Route("/console/bulk-cancel", guard(bulk_page), methods=["GET"]),
        Route("/console/bulk-cancel", guard(bulk_cancel), methods=["POST"]),
    ]


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
