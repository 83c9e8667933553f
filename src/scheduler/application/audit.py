"""The trails of scheduled events: the operators' audit trail and each row's history.

``operator_actions`` holds one row per command an operator (or sender) ran, written by
``scheduler.application.commands`` in the same transaction as the change; the rows it
touched are in ``operator_action_events``. A row's history (``scheduled_event_history``)
is appended by a database trigger on every change (``tr_scheduled_events_history``); the commands only name
the change and the actor.
"""

from __future__ import annotations

from typing import Any

from scheduler.database.database import Database, row_as_json


def list_actions(database: Database, *, limit: int = 100, before_id: int | None = None) -> list[dict[str, Any]]:
    """The audit trail, newest first; ``before_id`` continues from the previous page."""
    with database.begin() as session:
        return [row_as_json(r) for r in database.operations.list_actions(session, limit=limit, before_id=before_id)]


def event_actions(database: Database, event_id: str) -> list[dict[str, Any]]:
    """The operator actions that changed one row, newest first."""
    with database.begin() as session:
        return [row_as_json(r) for r in database.operations.event_actions(session, event_id)]


def event_notifications(database: Database, event_id: str) -> list[dict[str, Any]]:
    """The notifications one row produced, oldest first."""
    with database.begin() as session:
        return [row_as_json(r) for r in database.operations.event_notifications(session, event_id)]


def event_history(database: Database, event_id: str) -> list[dict[str, Any]] | None:
    """Every change of a row, oldest first; None when neither the row nor any history exists."""
    with database.begin() as session:
        entries = [row_as_json(r) for r in database.events.history(session, event_id)]
        if entries:
            return entries
        return [] if database.events.get(session, event_id) is not None else None
