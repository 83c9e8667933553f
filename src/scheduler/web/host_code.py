"""A host's own code schedules and cancels in its own transaction (EMB-13, EMB-14).

A host that saves a row of its own (a commitment) and its reminder wants both or neither:
``scheduler.schedule(session, service=..., ...)`` stores the reminder on the host's
``Session``, in the transaction the host is in, so it is committed with the host's commit
and gone with its rollback (River's ``InsertTx``, Oban's ``insert`` in an ``Ecto.Multi``,
procrastinate's ``defer`` on the caller's connection). It runs exactly what a
``POST /admin/scheduled-events`` runs: the one item check of the bulk store and the import
(``web.api.bulk_store.check_item``: the body's schema, the service's facts contract, the expiry),
then the same insert, or upsert by key (REQ-0064), through ``application.ingest``. What the
POST would answer with a 422 raises ``InvalidEvent`` (its ``errors``: each field and
message, and ``body``: the 422's body). A pending row is announced to prompt-mode replicas
by the database's trigger, and PostgreSQL delivers that NOTIFY when the host commits, never
on a rollback. ``scheduler.cancel`` withdraws a row the same way, audited as the API's
cancel is (source ``host``). ``schedule_async`` and ``cancel_async`` take an
``AsyncSession`` and run the same code through ``AsyncSession.run_sync``.

``service`` is the service the host built (anything with its ``settings``, ``clock`` and
``facts_contract``, the ``Service`` protocol): its schema, clock (``now``), default expiry
window, body bound and facts contract are the ones used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.orm import Session

from scheduler.application import commands, ingest
from scheduler.application.commands import Actor, CancelResult
from scheduler.application.events import EventRecord
from scheduler.config import Settings
from scheduler.nudging.facts import FactsContract
from scheduler.types import Clock
from scheduler.web.api.bulk_store import Refusal, check_item

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from scheduler.database.database import Database


class Service(Protocol):
    """What scheduling from a host's code reads of the service the host built."""

    @property
    def settings(self) -> Settings: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def facts_contract(self) -> FactsContract | None: ...
    @property
    def database(self) -> Database: ...

HOST_ACTOR = "host"  # the actor a row's history and the audit trail name when the host gives none


class InvalidEvent(ValueError):
    """What ``POST /admin/scheduled-events`` would refuse with a 422: ``errors`` lists each
    ``{"field", "message"}``, ``body`` is the 422's body."""

    def __init__(self, errors: list[dict[str, str]], body: dict[str, Any]) -> None:
        self.errors = errors
        self.body = body
        super().__init__("; ".join(f"{e['field']}: {e['message']}" for e in errors))


def _errors_of(body: dict[str, Any]) -> list[dict[str, str]]:
    """The ``{field, message}`` of a 422's body, whichever of the three shapes it has."""
    detail = body.get("detail")
    if "errors" in body:
        return list(body["errors"])
    if isinstance(detail, dict):
        return list(detail.get("errors", []))
    return [{"field": "facts", "message": str(detail)}]


def _checked(service: Service, **fields: Any) -> Any:
    """The event as the POST's check leaves it (a ``NewEvent``), or ``InvalidEvent``."""
    facts = fields["facts"]
    try:
        fields["facts"] = json.loads(json.dumps(facts)) if facts is not None else None
    except (TypeError, ValueError, RecursionError) as exc:
        message = f"must be JSON (objects, arrays, strings, numbers, booleans, null): {exc}"
        raise InvalidEvent([{"field": "facts", "message": message}],
                           {"detail": f"facts {message}", "errors": [{"field": "facts", "message": message}]}) from None
    for name in ("trigger_at", "expires_at"):
        value = fields[name]
        if isinstance(value, datetime):
            fields[name] = value.isoformat()  # a naive time has no offset: refused as the POST refuses it
    payload = {name: value for name, value in fields.items() if value is not None}
    checked = check_item(payload, max_item_bytes=service.settings.max_body_bytes,
                         default_expiry=service.settings.default_expiry, facts_contract=service.facts_contract)
    if isinstance(checked, Refusal):
        raise InvalidEvent(_errors_of(checked.body), checked.body)
    return checked


def schedule(session: Session, *, service: Service, event_type: str, user_id: str,
             trigger_at: datetime, facts: Mapping[str, Any] | None, external_key: str | None = None,
             community_id: str | None = None, expires_at: datetime | None = None,
             actor: str | None = None) -> EventRecord:
    """Store a scheduled event in ``session``'s transaction, as the POST stores it (see the
    module): a new row, or the row of ``external_key`` rewritten and reset. Nothing is
    committed here: the host's commit stores it, its rollback takes it away. ``actor`` (default
    ``host``) is who the row's history names. What the POST refuses raises ``InvalidEvent``."""
    event = _checked(service, event_type=event_type, user_id=user_id, trigger_at=trigger_at, facts=facts,
                     external_key=external_key, community_id=community_id, expires_at=expires_at)
    row = ingest.store_scheduled_event_in(
        session, service.database.events, event_type=event.event_type, user_id=event.user_id,
        community_id=event.community_id,
        external_key=event.external_key, trigger_at=event.trigger_at, facts=event.facts,
        expires_at=event.expires_at, now=service.clock.now(), actor=actor or HOST_ACTOR)
    return EventRecord.from_row(row)


async def schedule_async(session: AsyncSession, *, service: Service, event_type: str, user_id: str,
                         trigger_at: datetime, facts: Mapping[str, Any] | None, external_key: str | None = None,
                         community_id: str | None = None, expires_at: datetime | None = None,
                         actor: str | None = None) -> EventRecord:
    """``schedule`` on an ``AsyncSession`` (psycopg's async driver, asyncpg), in its transaction."""
    def run(sync_session: Session) -> EventRecord:
        return schedule(sync_session, service=service, event_type=event_type, user_id=user_id,
                        trigger_at=trigger_at, facts=facts, external_key=external_key,
                        community_id=community_id, expires_at=expires_at, actor=actor)

    return await session.run_sync(run)


def cancel(session: Session, *, service: Service, event_id: str | None = None,
           external_key: str | None = None, reason: str | None = None, actor: str | None = None) -> CancelResult:
    """Withdraw the row named by exactly one of ``event_id`` and ``external_key`` in
    ``session``'s transaction, as ``POST /admin/scheduled-events/{id}/cancel`` does: a pending
    or failed row becomes ``cancelled``; the result says what was found (``cancelled``,
    ``already_cancelled``, ``dispatched``, ``expired``, ``missing``). The change and its audit
    entry (source ``host``) are committed with the host's commit, gone with its rollback."""
    return commands.cancel_in(session, service.database, now=service.clock.now(),
                              actor=Actor(actor or HOST_ACTOR, "host"),
                              event_id=event_id, external_key=external_key, reason=reason)


async def cancel_async(session: AsyncSession, *, service: Service, event_id: str | None = None,
                       external_key: str | None = None, reason: str | None = None,
                       actor: str | None = None) -> CancelResult:
    """``cancel`` on an ``AsyncSession``, in its transaction."""
    def run(sync_session: Session) -> CancelResult:
        return cancel(sync_session, service=service, event_id=event_id, external_key=external_key,
                      reason=reason, actor=actor)

    return await session.run_sync(run)
