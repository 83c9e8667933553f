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
