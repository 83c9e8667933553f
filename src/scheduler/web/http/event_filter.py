"""The filter of scheduled events as query parameters: one declaration for every page that
lists or acts on rows by the application's query model (the API's list, the console's events
page, its bulk reset and bulk cancel).

Declared with ``Param``, so parsed strictly and documented before the query model
(``scheduler.application.events.EventQuery``) sees them (DEC-PARAMS).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.application import events
from scheduler.types import EventStatus
from scheduler.web.http.params import Param, Unprocessable

EVENT_FILTER: dict[str, Param] = {
    "status": Param.enum(EventStatus),
    "event_type": Param.string(max_length=events.MAX_TEXT),
    "user_id": Param.string(max_length=events.MAX_TEXT),
    "external_key": Param.string(max_length=events.MAX_TEXT),
    "community_id": Param.string(max_length=events.MAX_TEXT),
    "trigger_from": Param.time("trigger_at at or after (with a zone)"),
    "trigger_to": Param.time("trigger_at before (with a zone)"),
    "error_contains": Param.string("in last_error, any case", max_length=events.MAX_TEXT),
}
CURSOR = Param.string("the X-Next-Cursor of the previous page (same filters)", max_length=events.MAX_TEXT * 4)


def event_query(values: Mapping[str, Any], *, limit: int = 100) -> events.EventQuery:
    """The query model from the declared parameters' values (``EVENT_FILTER``, and
    ``cursor`` and ``limit`` where the route declares them); a cursor this service did not
    give is a 422 naming it."""
    try:
        cursor = events.Cursor.decode(values["cursor"]) if values.get("cursor") else None
    except events.QueryError as exc:
        raise Unprocessable.field(exc.field, exc.problem) from None
    return events.EventQuery(**{name: values[name] for name in EVENT_FILTER}, cursor=cursor,
                             limit=values.get("limit") or limit)


__all__ = ["CURSOR", "EVENT_FILTER", "event_query"]
