"""The oracle: a plain in-memory model of what REQ-0063 to REQ-0067 allow.

The model knows every stored row, which replica holds which rows, and what each claimed
event must become. It never looks at the database; the simulation compares the two after
every step through an observer connection (see ``observer.py``).

Row status is fully predictable: an event fails when its content says so (a Python or a
database error, or facts the engine refuses) and is dispatched otherwise. What the
orchestrator decides (sent, rate limited, duplicate) depends on timing across replicas, so
the model does not predict it; it checks it instead (the cap, one notification per key,
and that exactly the notifications of committed, successful dispatches exist).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime

# Event faults carried in the facts (``sim_fault``): what the dispatch of that event does,
# and the status each one leaves, whatever the dispatcher (harness.host).
from harness.host import EVENT_FAULTS, FAULT_STATUS, Expected

__all__ = ["EVENT_FAULTS", "Call", "Content", "Model", "OpenBatch", "Row"]


@dataclass(frozen=True)
class Content:
    """What a post writes: the participant, the trigger time and the facts that matter."""

    user: str
    trigger_at: datetime
    day: date
    fault: str | None
    version: int  # unique per post; stored in the facts as ``sim_version``
    expected: Expected | None = None  # a host's expectation of the event (harness.host)
    expires_at: datetime | None = None  # claimed after it, the row ends expired (EXP-2)

    def expired_at(self, now: datetime) -> bool:
        """Whether a claim at ``now`` ends this content expired (strictly after its expiry)."""
        return self.expires_at is not None and now > self.expires_at

    @property
    def expected_status(self) -> str:
        """The host's own failure first (its dispatcher raises, or returns its refusal, before
        a fault applies: SIM-HOST-5), then the fault's effect, then the host's expectation;
        the built-in platform has none."""
        if self.expected is not None and self.expected.status == "failed":
            return "failed"
        if self.fault is not None:
            return FAULT_STATUS[self.fault]
        return self.expected.status if self.expected is not None else "dispatched"

    @property
    def expected_reason(self) -> str | None:
        """What a failed event's ``last_error`` must contain, when the host said."""
        return self.expected.reason if self.expected is not None and self.expected.status == "failed" else None


@dataclass
class Row:
    """The committed state of one scheduled event, as the model believes it."""

    id: str
    key: str | None
    content: Content
    status: str = "pending"
    generation: int = 0  # bumped by every re-post and reset: a new chance to be dispatched
    has_error: bool = False
    has_dispatched_at: bool = False


@dataclass
class Call:
    """One dispatcher call, as the replica's dispatcher wrapper saw it."""

    replica: int
    event_id: str
    version: int
    result: str  # "ok", "refused" or "raised"
    outcome: str | None  # the platform's outcome: delivered, suppressed, duplicate, ...
    notification_ids: tuple[str, ...]
    batch: int  # serial of the model batch it belongs to


@dataclass
class OpenBatch:
    """A batch a replica holds: the rows it locked, in claim order, and what it did so far."""

    serial: int
    replica: int
    ids: list[str]
    generations: dict[str, int]
    versions: dict[str, int]
    # rows the claim locked but left alone: their participant was busy in another batch
    skipped: list[str] = field(default_factory=list)
    # rows the claim ended expired (locked, written by the claim's statement: EXP-2)
    expired: list[str] = field(default_factory=list)
    claimed_at: datetime | None = None  # the reference clock's time of the claim
    # the participants whose advisory locks the batch holds (those of its events)
    users: frozenset[str] = frozenset()
    position: int = 0
    outcomes: dict[str, str] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    dead: bool = False  # its backend was killed: it is gone server-side already


class Model:
    """Rows, open batches and the record of everything committed."""

    def __init__(self, caps: dict[str, int]) -> None:
        self.caps = caps
        self.rows: dict[str, Row] = {}
        self.order: list[str] = []  # row ids in creation order (steps name rows by index)
        self.by_key: dict[str, str] = {}
        self.batches: dict[int, OpenBatch] = {}
        self.serial = 0
        # (id, generation, version, status) of every committed outcome, in commit order
        self.processed: list[tuple[str, int, int, str]] = []
        # (id, generation, version) of every committed expiry (EXP-2), in commit order
        self.expired: list[tuple[str, int, int]] = []
        # committed dispatches of rows claimed after their expiry: (id, claimed at, expires_at)
        self.late_dispatches: list[tuple[str, datetime, datetime]] = []
        self.committed_calls: list[Call] = []
        self.expected_notifications: set[str] = set()
        self.duplicate_events: set[str] = set()  # events whose committed dispatch was a duplicate
        self.discarded_calls: list[Call] = []

    # -- rows -----------------------------------------------------------------------------

    def held(self, *, besides: int | None = None) -> dict[str, int]:
        """Row id -> replica, for every row locked by a live open batch."""
        held: dict[str, int] = {}
        for replica, batch in self.batches.items():
            if batch.dead or replica == besides:
                continue
            for event_id in (*batch.ids, *batch.skipped, *batch.expired):
                held[event_id] = replica
        return held

    def busy_users(self, *, besides: int | None = None) -> set[str]:
        """Participants whose advisory lock a live open batch of another replica holds."""
        busy: set[str] = set()
        for replica, batch in self.batches.items():
            if not batch.dead and replica != besides:
                busy |= batch.users
        return busy

    def holder_of_key(self, key: str | None) -> int | None:
        if key is None or key not in self.by_key:
            return None
        return self.held().get(self.by_key[key])

    def apply_post(self, event_id: str, key: str | None, content: Content) -> Row:
        """A post committed: a new row, or the key's row rewritten and pending again."""
        existing = self.by_key.get(key) if key is not None else None
        if existing is not None:
            row = self.rows[existing]
            row.content = content
            row.status = "pending"
            row.generation += 1
            row.has_error = row.has_dispatched_at = False
            return row
        row = Row(event_id, key, content)
        self.rows[event_id] = row
        self.order.append(event_id)
        if key is not None:
            self.by_key[key] = event_id
        return row

    def apply_cancel(self, event_id: str, outcome: str) -> str | None:
        """A cancel committed (or answered): None if ``outcome`` is what the committed status
        allows, else why not. Pending and failed rows become cancelled (a failed row keeps
        its error); a dispatched row stays dispatched (409); a cancelled one answers itself."""
        row = self.rows[event_id]
        expected = {"pending": "cancelled", "failed": "cancelled", "dispatched": "dispatched",
                    "cancelled": "already_cancelled", "expired": "expired"}[row.status]
        if outcome != expected:
            return (f"the cancel of {event_id} answered {outcome!r}, "
                    f"but the row was {row.status} (expected {expected!r})")
        if outcome == "cancelled":
            row.status = "cancelled"
            row.has_dispatched_at = False
        return None

    def apply_reset(self, event_id: str, outcome: str) -> str | None:
        """The operator's reset committed: pending again, nothing of the last run kept (every
        status is RESETTABLE, so a reset of a stored row always answers ``reset``)."""
        if outcome != "reset":
            return f"the reset of {event_id} answered {outcome!r}, but the row exists (expected 'reset')"
        row = self.rows[event_id]
        row.status = "pending"
        row.generation += 1
        row.has_error = row.has_dispatched_at = False
        return None

    # -- batches ----------------------------------------------------------------------------

    def expected_claim(self, replica: int, now: datetime,
                       batch_size: int) -> tuple[list[str], list[str], list[str]]:
        """What a claim takes, what it locks but skips (DEC-2), and what it ends expired
        (EXP-2), as the production claim does it: due pending rows not held by another
        replica and not past their expiry, oldest first, at most the batch size; rows of a
        participant another batch holds are skipped, and the claim takes further rounds past
        them until the batch is full or nothing more is due. Each round also ends up to as
        many rows past their expiry (by expires_at, then id) as it asks for, besides them."""
        held = self.held(besides=replica)
        locked_elsewhere = self.busy_users(besides=replica)
        pending = [r for r in self.rows.values() if r.status == "pending" and r.id not in held]
        due = [r for r in pending if r.content.trigger_at <= now and not r.content.expired_at(now)]
        due.sort(key=lambda r: (r.content.trigger_at, r.id))
        past = sorted((r for r in pending if r.content.expired_at(now)),
                      key=lambda r: (r.content.expires_at, r.id))
        expired: list[str] = []
        events: list[str] = []
        skipped: list[str] = []
        busy: set[str] = set()
        position = 0
        while True:
            wanted = batch_size - len(events)
            ending = past[len(expired):len(expired) + wanted]
            expired.extend(r.id for r in ending)
            taken: list[Row] = []
            while position < len(due) and len(taken) < wanted:
                row = due[position]
                position += 1
                if row.content.user not in busy:
                    taken.append(row)
            if not taken:
                break
            round_skipped = 0
            for row in taken:
                if row.content.user in locked_elsewhere:
                    busy.add(row.content.user)
                    skipped.append(row.id)
                    round_skipped += 1
                else:
                    events.append(row.id)
            if len(taken) < wanted or round_skipped == 0:
                break
        return events, skipped, expired

    def open_batch(self, replica: int, ids: list[str], skipped: list[str] | None = None,
                   expired: list[str] | None = None, claimed_at: datetime | None = None) -> OpenBatch:
        if replica in self.batches:
            raise AssertionError(f"replica {replica} already holds a batch")
        self.serial += 1
        batch = OpenBatch(
            self.serial, replica, list(ids),
            {i: self.rows[i].generation for i in (*ids, *(expired or ()))},
            {i: self.rows[i].content.version for i in (*ids, *(expired or ()))},
            skipped=list(skipped or ()),
            expired=list(expired or ()),
            claimed_at=claimed_at,
            users=frozenset(self.rows[i].content.user for i in ids),
        )
        self.batches[replica] = batch
        return batch

    def next_expected(self, replica: int) -> tuple[str, str] | None:
        """The next event the replica's batch dispatches, and the status it must end in."""
        batch = self.batches[replica]
        if batch.position >= len(batch.ids):
            return None
        event_id = batch.ids[batch.position]
        return event_id, self.rows[event_id].content.expected_status

    def record_outcome(self, replica: int, event_id: str, status: str, call: Call | None) -> None:
        batch = self.batches[replica]
        batch.position += 1
        batch.outcomes[event_id] = status
        if call is not None:
            batch.calls.append(call)

    def record_replay(self, replica: int, call: Call, *, current: str) -> None:
        """A call made inside the dispatch of ``current`` other than its last: the first, rolled
        back attempt of ``current``, or a replay of an earlier event of the batch, whose new
        call replaces the one rolled back (DEC-1: a failure rolls back to the checkpoint)."""
        batch = self.batches[replica]
        if call.event_id != current:
            if call.event_id not in batch.outcomes:
                raise AssertionError(f"replica {replica} replayed {call.event_id}, which it had not dispatched")
            rolled_back = [c for c in batch.calls if c.event_id == call.event_id]
            batch.calls = [c for c in batch.calls if c.event_id != call.event_id]
            self.discarded_calls.extend(rolled_back)
            batch.calls.append(call)
        else:
            self.discarded_calls.append(call)

    def last_calls(self, calls: list[Call]) -> list[Call]:
        """A whole poll's calls as the events' final ones, in the order the events first ran;
        the calls a failure rolled back go to ``discarded_calls``."""
        final: dict[str, Call] = {}
        for call in calls:
            if call.event_id in final:
                self.discarded_calls.append(final[call.event_id])
            final[call.event_id] = call
        return list(final.values())  # a dict keeps each key where it was first inserted

    def commit(self, replica: int) -> OpenBatch:
        """The batch committed: its outcomes and their effects become the committed state."""
        batch = self.batches.pop(replica)
        for event_id in batch.expired:
            row = self.rows[event_id]
            row.status = "expired"
            row.has_error, row.has_dispatched_at = True, False
            self.expired.append((event_id, batch.generations[event_id], batch.versions[event_id]))
        for event_id, status in batch.outcomes.items():
            row = self.rows[event_id]
            expires_at = row.content.expires_at
            if (status == "dispatched" and batch.claimed_at is not None and expires_at is not None
                    and batch.claimed_at > expires_at):
                self.late_dispatches.append((event_id, batch.claimed_at, expires_at))
            row.status = status
            row.has_error = status == "failed"
            row.has_dispatched_at = status == "dispatched"
            self.processed.append((event_id, batch.generations[event_id], batch.versions[event_id], status))
        for call in batch.calls:
            self.committed_calls.append(call)
            if call.result == "ok":
                self.expected_notifications.update(call.notification_ids)
                if call.outcome == "duplicate":
                    self.duplicate_events.add(call.event_id)
        return batch

    def discard(self, replica: int) -> OpenBatch:
        """The batch rolled back (aborted, crashed, killed): as if it never ran."""
        batch = self.batches.pop(replica)
        self.discarded_calls.extend(batch.calls)
        return batch

    # -- summaries ---------------------------------------------------------------------------

    def due_pending(self, now: datetime) -> list[str]:
        return sorted(r.id for r in self.rows.values() if r.status == "pending" and r.content.trigger_at <= now)

    def committed_counts(self) -> dict[str, int]:
        counts = {"dispatched": 0, "failed": 0}
        for *_, status in self.processed:
            counts[status] += 1
        return counts


def cut_by_stop(calls: list[Call]) -> set[str]:
    """The events a stop leaves pending when it arrived during the last event's call and
    that call failed under the optimistic batch's checkpoint (DEC-7, DEC-7.1): the batch ends
    before the replay, so that event and those since the last failure before it (rolled back
    with the checkpoint, never replayed) were never recorded. ``calls`` are the final calls
    of the poll's events, in the order they first ran."""
    if not calls or calls[-1].result == "ok":
        return set()
    cut = {calls[-1].event_id}
    for call in reversed(calls[:-1]):
        if call.result != "ok":
            break
        cut.add(call.event_id)
    return cut
