"""The console's outbox pages (OUTBOX-9..11): what did not get through, retry one, retry a filter.

``GET /console/deliveries`` lists the retrying and undeliverable rows (newest first, by
status, channel and participant, 50 a page), each with its last error and a retry-now form;
``POST /console/deliveries/{id}/retry`` queues one again; ``GET``/``POST
/console/bulk-retry`` is the dry-run count and the confirmed bulk retry, with a required
reason, like bulk reset. Every form carries the session's CSRF token, and the work is the
application layer's (``application.deliveries``), which audits each retry.
"""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from scheduler.application import commands, deliveries
from scheduler.application.events import QueryError, parse_time
from scheduler.web.console.sign_in import CSRF_FIELD, ConsoleGuard, console_session, csrf_ok
from scheduler.web.console.view import ConsoleView
from scheduler.web.http.params import (
    Param,
    Unprocessable,
    base_path,
    declares,
    path_param,
    query,
    whole_number,
)

PAGE_SIZE = 50
MAX_ID = 2**63 - 1
FILTER = {"status": Param.enum(deliveries.Retryable, "retrying or undeliverable (both when absent)"),
          "channel": Param.string("the channel", max_length=32), "user_id": Param.string("the participant")}


def delivery_query(q: dict[str, object]) -> deliveries.DeliveryQuery:
    status, channel, user_id = q.get("status"), q.get("channel"), q.get("user_id")
    return deliveries.DeliveryQuery(status if isinstance(status, deliveries.Retryable) else None,
                                    channel if isinstance(channel, str) else None,
                                    user_id if isinstance(user_id, str) else None)


def delivery_routes(console: ConsoleView, guard: ConsoleGuard) -> list[Route]:
    """``GET /console/deliveries``, ``POST /console/deliveries/{id}/retry`` and ``GET``/``POST
    /console/bulk-retry``."""

    @declares(**FILTER, before_id=Param.integer(1, MAX_ID, description="the previous page's last id"),
              retried=Param.integer(1, MAX_ID, description="the delivery just queued again"))
    async def list_page(request: Request) -> Response:
        q = query(request)
        where = delivery_query(q)
        found = await run_in_threadpool(lambda: deliveries.list_retryable(
            console.database, where, before_id=q["before_id"], limit=PAGE_SIZE + 1))
        more = len(found) > PAGE_SIZE
        found = found[:PAGE_SIZE]
        next_link = urlencode({**where.as_json(), "before_id": found[-1]["id"]}) if more else None
        return console.page(request, "deliveries.html", {
            "rows": found, "f": where.as_json(), "statuses": [str(s) for s in deliveries.Retryable],
            "filter_query": urlencode(where.as_json()), "next_link": next_link,
            "first_page": q["before_id"] is None, "retried": q["retried"]})

    @declares()
    async def retry_one(request: Request) -> Response:
        """Queue this delivery again, now (a reason is optional; audited)."""
        form = await console.form(request)
        session = console_session(request)
        if not csrf_ok(session, _text(form.get(CSRF_FIELD))):
            return console.csrf_refused(request)
        delivery_id = deliveries.delivery_id_of(path_param(request, "delivery_id"))
        actor = commands.Actor(session.subject, "console")
        done = await run_in_threadpool(lambda: deliveries.retry_delivery(
            console.database, delivery_id, now=console.clock.now(), actor=actor, reason=_text(form.get("reason"))))
        if done.outcome == "missing":
            return console.page(request, "error.html", {"message": "no delivery with that id"}, 404)
        if done.outcome == "not_retryable":
            status = done.delivery["status"] if done.delivery else "?"
            return console.page(request, "error.html", {
                "message": f"delivery {delivery_id} is {status}: only a retrying or undeliverable delivery that "
                           "no worker is sending right now can be retried"}, 409)
        return RedirectResponse(f"{base_path(request)}/console/deliveries?retried={delivery_id}", status_code=303)

    @declares(**FILTER)
    async def bulk_page(request: Request) -> Response:
        """The dry run: how many retrying or undeliverable rows match, and the form to retry them."""
        where = delivery_query(query(request))
        as_of = console.clock.now()
        count = await run_in_threadpool(lambda: deliveries.count_retryable(console.database, where, now=as_of))
        return console.page(request, "bulk_retry.html", {
            "f": where.as_json(), "count": count, "cap": commands.BULK_CAP, "as_of": as_of.isoformat(),
            "filter_query": urlencode(where.as_json()), "error": None, "reason": ""})

    @declares()
    async def bulk_retry(request: Request) -> Response:
        """Retry what the dry run counted (rows changed since are left alone), with a reason."""
        form = await console.form(request)
        session = console_session(request)
        if not csrf_ok(session, _text(form.get(CSRF_FIELD))):
            return console.csrf_refused(request)
        fields = {k: str(v) for k, v in form.items() if k in (*deliveries.FILTER_FIELDS, "as_of", "expected", "reason")}
        try:
            where = deliveries.DeliveryQuery.from_mapping(fields)
            as_of = parse_time("as_of", fields.get("as_of"))
            expected = whole_number("expected", fields.get("expected", ""), low=0, high=MAX_ID)
        except (QueryError, Unprocessable) as exc:
            return console.page(request, "error.html", {"message": f"bad bulk retry form: {exc}"}, 422)
        reason = fields.get("reason", "").strip()[:commands.MAX_REASON]
        if as_of is None or not reason:
            return console.page(request, "bulk_retry.html", {
                "f": where.as_json(), "count": expected, "cap": commands.BULK_CAP, "as_of": fields.get("as_of", ""),
                "filter_query": urlencode(where.as_json()), "error": "a bulk retry needs a reason",
                "reason": reason}, 422)
        actor = commands.Actor(session.subject, "console")
        result = await run_in_threadpool(lambda: deliveries.bulk_retry(
            console.database, where, now=console.clock.now(), as_of=as_of, expected=expected, actor=actor,
            reason=reason))
        return console.page(request, "bulk_retry_done.html", {
            "result": result, "expected": expected, "filter_query": urlencode(where.as_json())})

    return [
        Route("/console/deliveries", guard(list_page), methods=["GET"]),
        Route("/console/deliveries/{delivery_id}/retry", guard(retry_one), methods=["POST"]),
        Route("/console/bulk-retry", guard(bulk_page), methods=["GET"]),
        Route("/console/bulk-retry", guard(bulk_retry), methods=["POST"]),
    ]


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
