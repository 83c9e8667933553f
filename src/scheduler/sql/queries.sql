-- Every SQL statement of the scheduler, each a named block with a one-line description.
-- Time is always bound as :now; nothing here reads the database clock, so a frozen
-- clock in the tests and the simulation controls every decision.

-- name: claim_due_events
-- Take up to :batch_size due pending rows, oldest first, and lock them for this batch.
SELECT id, event_type, user_id, community_id, external_key, trigger_at, facts,
       status, last_error, created_at, updated_at, dispatched_at
FROM scheduled_events
-- only pending rows: dispatched and failed are terminal (REQ-0065); the partial
-- index ix_scheduled_events_pending_due holds exactly these rows
WHERE status = 'pending'
  -- due by the injected clock, never the database's
  AND trigger_at <= :now
  -- a later round of the same claim continues after the rows the earlier rounds saw
  -- (a keyset on the index order; the first round starts at -infinity)
  AND (trigger_at, id) > (:after_trigger, :after_id)
  -- participants whose lock an earlier round found busy: their rows stay untouched
  AND user_id <> ALL(CAST(:busy AS text[]))
-- oldest first; id breaks ties so that the order is total and replayable
ORDER BY trigger_at, id
-- bounded batch (SCHEDULER_BATCH_SIZE, 20 by default, less what earlier rounds took)
LIMIT :batch_size
-- the lock is held until the batch commits; rows another replica holds are skipped,
-- so two replicas never take the same row
FOR UPDATE SKIP LOCKED;

-- name: try_lock_participants
-- Try the advisory locks of the given participants without waiting; return those obtained.
-- pg_try_advisory_xact_lock never blocks, so a claim can never wait on a busy participant
-- and no order among locks is needed to rule out deadlocks (DEC-2)
SELECT t.k AS key
FROM unnest(CAST(:keys AS bigint[])) AS t(k)
WHERE pg_try_advisory_xact_lock(t.k);

-- name: next_pending_trigger
-- The earliest trigger_at of a pending row still in the future (prompt mode's next wake-up);
-- one step into the partial index ix_scheduled_events_pending_due.
SELECT min(trigger_at) FROM scheduled_events
WHERE status = 'pending' AND trigger_at > :now;

-- name: notify_due
-- Tell every replica's listener that a row became pending with this trigger time; sent
-- inside the storing transaction, so it is delivered only if that commits.
SELECT pg_notify('scheduler_due', :trigger_at);

-- name: lock_participant
-- Take one participant's advisory lock until the end of the transaction (re-entrant).
SELECT pg_advisory_xact_lock(:key);

-- name: mark_dispatched
-- Record a successful dispatch: the engine ran; any earlier error is cleared (REQ-0067).
UPDATE scheduled_events
SET status = 'dispatched', dispatched_at = :now, last_error = NULL, updated_at = :now
WHERE id = :id;

-- name: mark_failed
-- Record a failed dispatch with its reason; dispatched_at stays unset (REQ-0067).
UPDATE scheduled_events
SET status = 'failed', dispatched_at = NULL, last_error = :error, updated_at = :now
WHERE id = :id;

-- name: insert_event
-- Store a new scheduled event without an external key (two posts are two rows).
INSERT INTO scheduled_events (id, event_type, user_id, community_id, external_key,
                              trigger_at, facts, status, created_at, updated_at)
VALUES (:id, :event_type, :user_id, :community_id, NULL,
        :trigger_at, CAST(:facts AS jsonb), 'pending', :now, :now)
RETURNING *;

-- name: upsert_event_by_key
-- Store or rewrite the row of an external key in one atomic statement (REQ-0064).
INSERT INTO scheduled_events (id, event_type, user_id, community_id, external_key,
                              trigger_at, facts, status, created_at, updated_at)
VALUES (:id, :event_type, :user_id, :community_id, :external_key,
        :trigger_at, CAST(:facts AS jsonb), 'pending', :now, :now)
-- the unique constraint arbitrates between concurrent posts of one key; a row that a
-- replica is dispatching is locked, so this waits for that batch, then rewrites the
-- newest version
ON CONFLICT (external_key) DO UPDATE
SET event_type = EXCLUDED.event_type,
    user_id = EXCLUDED.user_id,
    community_id = EXCLUDED.community_id,
    trigger_at = EXCLUDED.trigger_at,
    facts = EXCLUDED.facts,
    status = 'pending',
    dispatched_at = NULL,
    last_error = NULL,
    updated_at = EXCLUDED.updated_at
RETURNING *;

-- name: get_event
-- One scheduled event by id.
SELECT * FROM scheduled_events WHERE id = :id;

-- name: list_events
-- Scheduled events for an operator, newest change first, optionally by status and user.
SELECT * FROM scheduled_events
WHERE (CAST(:status AS text) IS NULL OR status = :status)
  AND (CAST(:user_id AS text) IS NULL OR user_id = :user_id)
  AND (CAST(:external_key AS text) IS NULL OR external_key = :external_key)
ORDER BY updated_at DESC, id
LIMIT :limit;

-- name: reset_event
-- The operator's reset by hand: back to pending, dispatched_at and last_error cleared.
UPDATE scheduled_events
SET status = 'pending', dispatched_at = NULL, last_error = NULL, updated_at = :now
WHERE id = :id
RETURNING *;

-- name: claim_dedup_key
-- Claim a deduplication key; the primary key decides between racing writers.
INSERT INTO dedup_keys (key, notification_id, created_at)
VALUES (:key, :notification_id, :now)
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- name: record_duplicate
-- Count one more duplicate of a key and return how many there have been.
UPDATE dedup_keys
SET duplicate_count = duplicate_count + 1, last_duplicate_at = :now
WHERE key = :key
RETURNING duplicate_count, duplicate_notification_id;

-- name: link_duplicate_notification
-- Remember the one suppressed_dedup notification recorded for a key.
UPDATE dedup_keys SET duplicate_notification_id = :notification_id WHERE key = :key;

-- name: count_sent_today
-- A participant's sent deliveries since the start of the current UTC day.
SELECT count(*) FROM deliveries
WHERE user_id = :user_id AND status = 'sent' AND created_at >= :day_start AND created_at < :day_end;

-- name: get_preferences
-- A participant's enabled kinds (NULL: all) and daily cap.
SELECT enabled_kinds, max_per_day FROM participant_preferences WHERE user_id = :user_id;

-- name: upsert_preferences
-- Set a participant's enabled kinds and daily cap.
INSERT INTO participant_preferences (user_id, enabled_kinds, max_per_day, updated_at)
VALUES (:user_id, :enabled_kinds, :max_per_day, :now)
ON CONFLICT (user_id) DO UPDATE
SET enabled_kinds = EXCLUDED.enabled_kinds, max_per_day = EXCLUDED.max_per_day,
    updated_at = EXCLUDED.updated_at
RETURNING user_id, enabled_kinds, max_per_day, updated_at;

-- name: insert_notification
-- Record a notification (sent, suppressed or failed) for a participant.
INSERT INTO notifications (id, user_id, community_id, rule_id, kind, scenario, time_scope,
                           dedup_key, title, body, status, reason, source,
                           scheduled_event_id, created_at)
VALUES (:id, :user_id, :community_id, :rule_id, :kind, :scenario, :time_scope,
        :dedup_key, :title, :body, :status, :reason, :source,
        :scheduled_event_id, :now);

-- name: insert_delivery
-- Log one channel's delivery of a notification.
INSERT INTO deliveries (notification_id, user_id, channel, status, detail, created_at)
VALUES (:notification_id, :user_id, :channel, :status, :detail, :now);

-- name: list_notifications
-- Participants' notifications for an operator, newest first.
SELECT id, user_id, community_id, rule_id, kind, scenario, time_scope, dedup_key, title, body,
       status, reason, source, scheduled_event_id, created_at
FROM notifications
WHERE (CAST(:user_id AS text) IS NULL OR user_id = :user_id)
  AND (CAST(:status AS text) IS NULL OR status = :status)
ORDER BY created_at DESC, id
LIMIT :limit;

-- ---------------------------------------------------------------------------------------
-- The event lifecycle (issue 10): cancel, history, retention, the participant's inbox.
-- ---------------------------------------------------------------------------------------

-- name: set_change_context
-- Name the change and its actor for the history trigger, until this transaction ends.
SELECT set_config('scheduler.change', :change, true), set_config('scheduler.actor', :actor, true);

-- name: lock_event_by_id
-- Lock one row for a cancel; waits for a batch that is dispatching it, then reads its newest version.
SELECT * FROM scheduled_events WHERE id = :id FOR UPDATE;

-- name: lock_event_by_key
-- Lock the row of an external key for a cancel, as lock_event_by_id does.
SELECT * FROM scheduled_events WHERE external_key = :external_key FOR UPDATE;

-- name: cancel_event
-- Withdraw a pending or failed row: terminal `cancelled`, never claimed (the claim reads pending only).
UPDATE scheduled_events
SET status = 'cancelled', dispatched_at = NULL, updated_at = :now
-- the caller holds the row lock; the status test keeps a dispatched row dispatched
WHERE id = :id AND status IN ('pending', 'failed')
RETURNING *;

-- name: event_history
-- Every change of one scheduled event, oldest first (the trigger appends them).
SELECT id, event_id, at, change, actor, status, changes
FROM scheduled_event_history
WHERE event_id = :id
ORDER BY id;

-- name: try_retention_lock
-- Elect the one replica that runs retention now, until this transaction ends (never waits).
-- transaction-level, so it also holds behind a transaction-pooling PgBouncer
SELECT pg_try_advisory_xact_lock(:key);

-- name: claim_maintenance_run
-- Start a periodic task's run unless one started less than :interval_seconds ago (by :now).
INSERT INTO scheduler_maintenance (task, last_run_at)
VALUES (:task, :now)
ON CONFLICT (task) DO UPDATE SET last_run_at = EXCLUDED.last_run_at
-- a run started within the interval (by the injected clock) keeps its time: no new run
WHERE scheduler_maintenance.last_run_at <= CAST(:now AS timestamptz) - make_interval(secs => :interval_seconds)
   -- a clock that went back (a frozen test clock, a corrected host) must not stall retention forever
   OR scheduler_maintenance.last_run_at > :now
RETURNING last_run_at;

-- name: delete_expired_events
-- Delete up to :batch_size rows dispatched or cancelled before :cutoff, with their history.
WITH doomed AS (
    SELECT id FROM scheduled_events
    -- only terminal successes and withdrawals: failed and pending rows are never deleted;
    -- ix_scheduled_events_finished holds exactly these rows, by updated_at
    WHERE status IN ('dispatched', 'cancelled') AND updated_at < :cutoff
    ORDER BY updated_at
    -- a small batch: each runs in its own short transaction
    LIMIT :batch_size
    -- a row a re-post or a cancel is changing right now is left for the next run
    FOR UPDATE SKIP LOCKED
), history AS (
    DELETE FROM scheduled_event_history WHERE event_id IN (SELECT id FROM doomed)
)
DELETE FROM scheduled_events WHERE id IN (SELECT id FROM doomed)
RETURNING id;

-- name: lock_stream_order
-- Serialise stream numbering across replicas until commit, so stream order is commit order.
SELECT pg_advisory_xact_lock(:key);

-- name: number_for_stream
-- Give delivered notifications (a batch's) their places in the inbox stream, once each.
UPDATE notifications
SET stream_seq = nextval('notification_stream_seq')
WHERE id = ANY(CAST(:ids AS text[])) AND stream_seq IS NULL
RETURNING stream_seq;

-- name: notify_inbox
-- Wake every replica's inbox (LISTEN scheduler_inbox); the payload is the stream number.
SELECT pg_notify(:channel, :payload);

-- name: stream_tail
-- Streamed notifications after :after in stream order: every replica's live fan-out reads this.
SELECT id, user_id, community_id, rule_id, kind, scenario, time_scope, title, body,
       source, scheduled_event_id, created_at, stream_seq
FROM notifications
WHERE stream_seq > :after
ORDER BY stream_seq
LIMIT :limit;

-- name: stream_head
-- The newest stream number (0 when nothing was streamed yet).
SELECT coalesce(max(stream_seq), 0) FROM notifications WHERE stream_seq IS NOT NULL;

-- name: participant_stream_after
-- One participant's streamed notifications after :after, in stream order (a Last-Event-ID replay).
SELECT id, user_id, community_id, rule_id, kind, scenario, time_scope, title, body,
       source, scheduled_event_id, created_at, stream_seq
FROM notifications
WHERE user_id = :user_id AND stream_seq > :after
ORDER BY stream_seq
LIMIT :limit;

-- name: participant_notifications
-- One participant's delivered notifications, newest first, after an optional keyset cursor.
SELECT id, user_id, community_id, rule_id, kind, scenario, time_scope, title, body,
       source, scheduled_event_id, created_at, stream_seq
FROM notifications
WHERE user_id = :user_id
  -- only what reached the participant: suppressed and failed decisions are the operator's
  AND status = 'sent'
  -- keyset: strictly older than the last row of the previous page
  AND (CAST(:before_at AS timestamptz) IS NULL
       OR (created_at, id) < (CAST(:before_at AS timestamptz), CAST(:before_id AS text)))
ORDER BY created_at DESC, id DESC
LIMIT :limit;
