-- Every SQL statement of the scheduler, each a named block with a one-line description.
-- Time is always bound as :now; no statement but database_clock reads the database clock,
-- so a frozen clock in the tests and the simulation controls every decision. In production
-- :now comes from the database's clock anyway (DatabaseClock, DEC-10), measured with
-- database_clock.

-- name: database_clock
-- The server's current time (not the transaction's): production's clock measures its offset with it.
SELECT clock_timestamp();

-- name: participant_lock_key
-- A fragment, not a statement: a participant's advisory-lock key from its user_id, the first 8 bytes of sha256('nudging-participant:' || user_id) as a signed bigint (database.events.participant_lock_key computes the same in Python).
('x' || left(encode(sha256(convert_to('nudging-participant:' || user_id, 'UTF8')), 'hex'), 16))::bit(64)::bigint

-- name: claim_due_events
-- Take up to :batch_size due pending rows, oldest first, lock them for this batch, and try their participants' locks in the same statement (held: whether this transaction got it); end up to :batch_size rows claimed after their expires_at as expired (expired: true) without a batch slot (EXP-2, DEC-EXPIRY).
-- Every step is a MATERIALIZED CTE, evaluated once and wholly before the step that reads
-- it: the rows are locked first (exactly the rows returned: the row locks are taken under
-- the LIMIT), then each of their participants is try-locked exactly once, and never a
-- participant of a row the claim did not return (DEC-2)
WITH outcomes AS MATERIALIZED (
    -- rows claimed after their expires_at by the injected clock: never dispatched, no
    -- participant lock needed (their engine does not run); their outcome is expired at the
    -- claim's time, the moment it was claimed (the history trigger records it then), and
    -- last_error says how late
    SELECT d.id, 'expired' AS status, CAST(:now AS timestamptz) AS at, CAST(NULL AS timestamptz) AS not_before,
           'expired: claimed ' || concat_ws(' ',
            CASE WHEN extract(day FROM d.late) > 0 THEN extract(day FROM d.late)::int || 'd' END,
            CASE WHEN extract(hour FROM d.late) > 0 THEN extract(hour FROM d.late)::int || 'h' END,
            CASE WHEN extract(minute FROM d.late) > 0 THEN extract(minute FROM d.late)::int || 'm' END,
            CASE WHEN floor(extract(second FROM d.late)) > 0 OR d.late < interval '1 minute'
                 THEN floor(extract(second FROM d.late))::int || 's' END)
            || ' after its expires_at ' || to_char(d.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
           AS error
    FROM (
        -- ix_scheduled_events_pending_expiry holds exactly the pending rows with an expiry;
        -- expires_at > trigger_at (a CHECK), so every one of these is due; a row held in
        -- quiet hours past its expires_at ends here too, never sent (DEC-LOCAL-TIME)
        SELECT id, expires_at, CAST(:now AS timestamptz) - expires_at AS late
        FROM scheduler.scheduled_events
        WHERE status = 'pending' AND expires_at < :now
        ORDER BY expires_at, id
        -- bounded like the batch, but not counted against it: a backlog of expired rows
        -- drains at most a batch size a claim, and never delays a row still worth sending
        LIMIT :batch_size
        -- a row another replica holds is its to decide
        FOR UPDATE SKIP LOCKED
    ) AS d
), expired AS MATERIALIZED (
    -- the one write of a claimed row's outcome (DEC-1.7)
    {{write_outcomes}}
    RETURNING e.id, e.event_type, e.user_id, e.community_id, e.external_key, e.trigger_at, e.facts,
              e.status, e.last_error, e.created_at, e.updated_at, e.dispatched_at, e.traceparent,
              e.not_before, e.due_at
), claimed AS MATERIALIZED (
    SELECT id, event_type, user_id, community_id, external_key, trigger_at, facts,
           status, last_error, created_at, updated_at, dispatched_at, traceparent, not_before, due_at
    FROM scheduler.scheduled_events
    -- only pending rows: dispatched and failed are terminal (REQ-0065); the partial
    -- index ix_scheduled_events_pending_due holds exactly these rows
    WHERE status = 'pending'
      -- due by the injected clock, never the database's: at its trigger_at, or at the end of
      -- the quiet hours that hold it (due_at = coalesce(not_before, trigger_at), generated);
      -- a held row sits at its not_before in the index, so it costs the claim nothing until
      -- then (QUIET-3, PERF-HELD)
      AND due_at <= :now
      -- not past its expiry (those beyond the expired step's bound wait for the next claim,
      -- which ends them expired: a row claimed after its expires_at is never dispatched)
      AND (expires_at IS NULL OR expires_at >= :now)
      -- a later round of the same claim continues after the rows the earlier rounds saw
      -- (a keyset on the index order; the first round starts before every row Python can
      -- read, core.store.BEFORE_EVERY_TRIGGER)
      AND (due_at, id) > (:after_due, :after_id)
      -- participants whose lock an earlier round found busy: their rows stay untouched
      AND user_id <> ALL(CAST(:busy AS text[]))
    -- oldest first (by trigger_at when nothing is held: REQ-0065's order, DEC-LOCAL-TIME);
    -- id breaks ties so that the order is total and replayable
    ORDER BY due_at, id
    -- bounded batch (SCHEDULER_BATCH_SIZE, 20 by default, less what earlier rounds took)
    LIMIT :batch_size
    -- the lock is held until the batch commits; rows another replica holds are skipped,
    -- so two replicas never take the same row
    FOR UPDATE SKIP LOCKED
), participants AS MATERIALIZED (
    -- each participant of the claimed rows once
    SELECT DISTINCT user_id FROM claimed
), held AS MATERIALIZED (
    -- pg_try_advisory_xact_lock never blocks, so a claim can never wait on a busy
    -- participant and no order among locks is needed to rule out deadlocks (DEC-2);
    -- the aggregate reads every participant, so each is tried, once
    SELECT coalesce(array_agg(user_id), CAST(ARRAY[] AS text[])) AS users
    FROM participants
    WHERE pg_try_advisory_xact_lock({{participant_lock_key}})
)
SELECT c.id, c.event_type, c.user_id, c.community_id, c.external_key, c.trigger_at, c.facts,
       c.status, c.last_error, c.created_at, c.updated_at, c.dispatched_at, c.traceparent,
       c.not_before, c.due_at, c.user_id = ANY(h.users) AS held, FALSE AS expired
FROM claimed AS c CROSS JOIN held AS h
-- the expired rows after the claimed ones (the claim's keyset reads the claimed rows only)
UNION ALL
SELECT x.id, x.event_type, x.user_id, x.community_id, x.external_key, x.trigger_at, x.facts,
       x.status, x.last_error, x.created_at, x.updated_at, x.dispatched_at, x.traceparent,
       x.not_before, x.due_at, FALSE AS held, TRUE AS expired
FROM expired AS x
ORDER BY expired, due_at, id;

-- name: next_pending_trigger
-- The earliest due_at of a pending row still in the future (prompt mode's next wake-up: a trigger_at, or a held row's not_before);
-- one step into the partial index ix_scheduled_events_pending_due.
SELECT min(due_at) FROM scheduler.scheduled_events
WHERE status = 'pending' AND due_at > :now;

-- name: set_local_settings
-- The service's timeouts and time zone (and, on its own engines, its search_path) for this transaction only: sent with the transaction's first statement behind a transaction-pooling proxy and on a host's engine, whose sessions are not ours to change.
SELECT set_config('statement_timeout', :statement, true), set_config('lock_timeout', :lock, true),
       -- a session frozen inside this transaction is ended by the server, releasing its locks
       set_config('idle_in_transaction_session_timeout', :idle, true),
       -- times read back in UTC whatever the server's default zone (DEC-UTC)
       set_config('TimeZone', :zone, true),
       -- NULL on a host's engine: its search_path stays as it is (every statement names its schema)
       set_config('search_path', coalesce(:search_path, current_setting('search_path')), true);

-- name: lock_participant
-- Take one participant's advisory lock until the end of the transaction (re-entrant).
SELECT pg_advisory_xact_lock(:key);

-- name: write_outcomes
-- A fragment, not a statement: the one write of claimed rows' outcomes (dispatched, failed, expired: DEC-1.7; pending when held in quiet hours, QUIET-2), from the rows of the relation outcomes(id, status, error, at, not_before) its statement defines; record_outcomes, write_batch_decisions and claim_due_events include it as {{write_outcomes}}.
UPDATE scheduler.scheduled_events AS e
-- dispatched: the engine ran, dispatched_at is the event's own time, any earlier error is
-- cleared; failed: the reason, and no dispatched_at; expired: how late it was claimed, and
-- no dispatched_at; pending: held in its participant's quiet hours until not_before (QUIET-2),
-- no error; a row not held keeps its not_before
SET status = o.status,
    dispatched_at = CASE WHEN o.status = 'dispatched' THEN o.at END,
    last_error = o.error,
    not_before = coalesce(o.not_before, e.not_before),
    updated_at = o.at
FROM outcomes AS o
-- by primary key: only rows this transaction claimed and still holds locked
WHERE e.id = o.id

-- name: batch_outcomes
-- A fragment, not a statement: a batch's outcomes as the rows write_outcomes reads, one element of each array per event, in the batch's order; record_outcomes and write_batch_decisions include it as {{batch_outcomes}}.
-- one row per claimed event, each with its own time (lateness is measured from it); the
-- arrays are constants the planner counts, so the rows are found by primary key (PERF-7)
SELECT * FROM unnest(CAST(:ids AS text[]), CAST(:statuses AS text[]), CAST(:errors AS text[]),
                     CAST(:times AS timestamptz[]), CAST(:not_befores AS timestamptz[]))
              AS o(id, status, error, at, not_before)

-- name: record_outcomes
-- Record a batch's outcomes at its end, one array element per event (REQ-0067).
WITH outcomes AS (
    {{batch_outcomes}}
)
{{write_outcomes}}
{{outcomes_by_key}};

-- name: outcomes_by_key
-- A fragment, not a statement: a clause after write_outcomes where the outcomes are a batch's arrays (batch_outcomes), naming its rows again as one array so that each is found by primary key; record_outcomes and write_batch_decisions include it as {{outcomes_by_key}}.
-- joined to the outcomes alone, a table of some tens of thousands of rows was read whole by a
-- hashed sequential scan (cheaper than a hundred probes by the planner's count of a random
-- read), so a burst's every batch read every row stored so far (DEC-PLANS); the claim's expired
-- step, whose few rows its own index finds, keeps the join alone and its plan (PERF-1)
  AND e.id = ANY(ARRAY(SELECT id FROM outcomes))

-- name: mark_dispatched
-- One row dispatched (the benchmarks' raw-SQL ceiling and the status-first broken variant).
UPDATE scheduler.scheduled_events
SET status = 'dispatched', dispatched_at = :now, last_error = NULL, updated_at = :now
WHERE id = :id;

-- name: insert_event
-- Store a new scheduled event without an external key (two posts are two rows).
INSERT INTO scheduler.scheduled_events (id, event_type, user_id, community_id, external_key,
                              trigger_at, expires_at, facts, status, created_at, updated_at, traceparent)
VALUES (:id, :event_type, :user_id, :community_id, NULL,
        :trigger_at, :expires_at, CAST(:facts AS jsonb), 'pending', :now, :now, :traceparent)
RETURNING *;

-- name: insert_held_event
-- Store a live event that arrived in its participant's quiet hours as a scheduled row due when they end (QUIET-7, REQ-0066): trigger_at its arrival, not_before the end.
INSERT INTO scheduler.scheduled_events (id, event_type, user_id, community_id, external_key,
                              trigger_at, expires_at, facts, status, created_at, updated_at, traceparent,
                              not_before)
VALUES (:id, :event_type, :user_id, :community_id, NULL,
        :now, :expires_at, CAST(:facts AS jsonb), 'pending', :now, :now, :traceparent, :not_before)
RETURNING *;

-- name: rewrite_by_key
-- A fragment, not a statement: what a post of a known external key does to its row (REQ-0064), shared by the single store and the batch so the two never drift.
-- the unique constraint arbitrates between concurrent posts of one key; a row that a
-- replica is dispatching is locked, so this waits for that batch, then rewrites the
-- newest version
ON CONFLICT (external_key) DO UPDATE
SET event_type = EXCLUDED.event_type,
    user_id = EXCLUDED.user_id,
    community_id = EXCLUDED.community_id,
    trigger_at = EXCLUDED.trigger_at,
    -- the new post's expiry (or none): a rewrite re-arms an expired row (EXP-4)
    expires_at = EXCLUDED.expires_at,
    facts = EXCLUDED.facts,
    status = 'pending',
    dispatched_at = NULL,
    last_error = NULL,
    -- a re-post is decided afresh at its new trigger_at: no hold carries over (DEC-LOCAL-TIME)
    not_before = NULL,
    updated_at = EXCLUDED.updated_at,
    -- the rewrite's request is the one a dispatch now links to
    traceparent = EXCLUDED.traceparent

-- name: upsert_event_by_key
-- Store or rewrite the row of an external key in one atomic statement (REQ-0064).
INSERT INTO scheduler.scheduled_events (id, event_type, user_id, community_id, external_key,
                              trigger_at, expires_at, facts, status, created_at, updated_at, traceparent)
VALUES (:id, :event_type, :user_id, :community_id, :external_key,
        :trigger_at, :expires_at, CAST(:facts AS jsonb), 'pending', :now, :now, :traceparent)
{{rewrite_by_key}}
RETURNING *;

-- name: store_events_batch
-- Store many scheduled events, or rewrite and reset the rows of their external keys, in one statement (REQ-0064, BATCH-3): one element of :items per event; keys taken in a fixed order (BATCH-4).
INSERT INTO scheduler.scheduled_events (id, event_type, user_id, community_id, external_key,
                              trigger_at, expires_at, facts, status, created_at, updated_at, traceparent)
SELECT i.id, i.event_type, i.user_id, i.community_id, i.external_key,
       i.trigger_at, i.expires_at, i.facts, 'pending', :now, :now, :traceparent
FROM jsonb_to_recordset(CAST(:items AS jsonb))
     AS i(ord integer, id text, event_type text, user_id text, community_id text, external_key text,
          trigger_at timestamptz, expires_at timestamptz, facts jsonb)
-- rows are inserted (and conflicting rows locked) in this order: two batches that share
-- keys wait for each other in the same order, so they never deadlock; the keys of one
-- request are distinct (a repeat is refused before this statement), so no row is
-- affected twice
ORDER BY i.external_key COLLATE "C" NULLS LAST, i.ord
-- exactly the single store's rewrite (upsert_event_by_key)
{{rewrite_by_key}}
-- xmax is 0 on a row this statement inserted, the locking transaction on one it rewrote
RETURNING *, (xmax = 0) AS inserted;

-- name: get_event
-- One scheduled event by id.
SELECT * FROM scheduler.scheduled_events WHERE id = :id;

-- name: event_filter
-- A fragment, not a statement: the one WHERE clause of every list, count and bulk action over scheduled events (EventQuery.params binds it); statements include it as {{event_filter}}.
(CAST(:status AS text) IS NULL OR status = :status)
  AND (CAST(:event_type AS text) IS NULL OR event_type = :event_type)
  AND (CAST(:user_id AS text) IS NULL OR user_id = :user_id)
  AND (CAST(:external_key AS text) IS NULL OR external_key = :external_key)
  AND (CAST(:community_id AS text) IS NULL OR community_id = :community_id)
  AND (CAST(:trigger_from AS timestamptz) IS NULL OR trigger_at >= :trigger_from)
  AND (CAST(:trigger_to AS timestamptz) IS NULL OR trigger_at < :trigger_to)
  -- :error_like is the text with LIKE's wildcards escaped, wrapped in %
  AND (CAST(:error_like AS text) IS NULL OR last_error ILIKE :error_like)

-- name: list_events
-- One page of the API's list (GET /admin/scheduled-events): the filter, newest change first then id, keyset-paginated.
SELECT * FROM scheduler.scheduled_events
WHERE {{event_filter}}
  -- keyset in this order (updated_at descending, id ascending): strictly after the previous page's last row
  AND (CAST(:after_at AS timestamptz) IS NULL
       OR updated_at < :after_at
       OR (updated_at = :after_at AND id > :after_id))
ORDER BY updated_at DESC, id
LIMIT :limit;

-- name: reset_event
-- The operator's reset of one row the caller has locked: back to pending, dispatched_at and last_error cleared, if its status allows.
UPDATE scheduler.scheduled_events
SET status = 'pending', dispatched_at = NULL, last_error = NULL, not_before = NULL, updated_at = :now
-- :sources is RESETTABLE (scheduler.application.commands): the same statuses every adapter resets
WHERE id = :id AND status = ANY(CAST(:sources AS text[]))
RETURNING *;

-- name: upsert_preferences
-- Set a participant's enabled kinds, daily cap, time zone and quiet hours; a change of the zone or the quiet hours releases their held rows (not_before cleared: decided again at the next claim, QUIET-5).
WITH before AS MATERIALIZED (
    -- the row as it was (every part of this statement sees the same snapshot)
    SELECT time_zone, quiet_hours_start, quiet_hours_end
    FROM scheduler.participant_preferences WHERE user_id = :user_id
), released AS (
    UPDATE scheduler.scheduled_events AS e
    SET not_before = NULL, updated_at = :now
    -- ix_scheduled_events_user_id: only this participant's rows
    WHERE e.user_id = :user_id AND e.status = 'pending' AND e.not_before IS NOT NULL
      AND (SELECT (b.time_zone, b.quiet_hours_start, b.quiet_hours_end) FROM before AS b)
          IS DISTINCT FROM (CAST(:time_zone AS text), CAST(:quiet_start AS time), CAST(:quiet_end AS time))
    RETURNING e.id
)
INSERT INTO scheduler.participant_preferences (user_id, enabled_kinds, max_per_day, time_zone,
                                               quiet_hours_start, quiet_hours_end, updated_at)
VALUES (:user_id, :enabled_kinds, :max_per_day, :time_zone, :quiet_start, :quiet_end, :now)
ON CONFLICT (user_id) DO UPDATE
SET enabled_kinds = EXCLUDED.enabled_kinds, max_per_day = EXCLUDED.max_per_day,
    time_zone = EXCLUDED.time_zone, quiet_hours_start = EXCLUDED.quiet_hours_start,
    quiet_hours_end = EXCLUDED.quiet_hours_end, updated_at = EXCLUDED.updated_at
RETURNING user_id, enabled_kinds, max_per_day, time_zone, quiet_hours_start, quiet_hours_end, updated_at;

-- name: get_preferences
-- One participant's preferences (no row: the defaults).
SELECT user_id, enabled_kinds, max_per_day, time_zone, quiet_hours_start, quiet_hours_end, updated_at
FROM scheduler.participant_preferences WHERE user_id = :user_id;

-- name: read_batch_limits
-- A batch's decision inputs in one round trip (a live event is a batch of one): its participants' preferences (time zone and quiet hours too), the times of their sent notifications within 48 hours of now (the decision counts those in each participant's own day, QUIET-4), its keys already taken.
-- exact because the transaction holds every one of these participants' locks (the claim's,
-- DEC-2, or a live event's lock_participant): no other transaction adds a notification or a
-- key of theirs until this one ends
SELECT
    (SELECT coalesce(json_agg(json_build_array(p.user_id, p.enabled_kinds, p.max_per_day, p.time_zone,
                                               to_char(p.quiet_hours_start, 'HH24:MI'),
                                               to_char(p.quiet_hours_end, 'HH24:MI'))), '[]')
     FROM scheduler.participant_preferences AS p
     -- the ids as an array the planner cannot count, so each is one probe of the primary key
     -- however many rows the table holds: counted, a hundred of them made a sequential scan of
     -- some thousands of rows look cheaper, each row compared with every id (DEC-PLANS)
     WHERE p.user_id = ANY(ARRAY(SELECT unnest(CAST(:user_ids AS text[]))))) AS preferences,
    -- per participant (by its position in the user_ids array) the times of its sent
    -- notifications in the window around now: the decision's own record, whatever
    -- becomes of their deliveries (ix_notifications_user_id_created_at). Every local day lies
    -- within 48 hours of its instants, so the window holds the participant's whole day (LOCAL-5);
    -- the day itself is zoneinfo's, in Python, never AT TIME ZONE (DEC-LOCAL-TIME)
    (SELECT coalesce(json_agg(json_build_array(
                w.n,
                (SELECT coalesce(json_agg(to_char(d.created_at AT TIME ZONE 'UTC',
                                                  'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')), '[]')
                 FROM scheduler.notifications AS d
                 WHERE d.user_id = w.user_id AND d.status = 'sent'
                   AND d.created_at >= :window_start AND d.created_at < :window_end))), '[]')
     FROM unnest(CAST(:user_ids AS text[])) WITH ORDINALITY AS w(user_id, n)
    ) AS sent_recently,
    (SELECT coalesce(json_agg(json_build_array(k.key, k.duplicate_notification_id)), '[]')
     FROM scheduler.dedup_keys AS k
     -- by the primary key whatever the table's size, as the preferences above (DEC-PLANS)
     WHERE k.key = ANY(ARRAY(SELECT unnest(CAST(:keys AS text[]))))) AS taken_keys;

-- name: write_batch_decisions
-- A batch's decisions in one statement (a live event is a batch of one): new keys, repeated keys, notifications, every channel's deliveries and the outcomes (none for a live event).
-- the batch parameter is one JSON document with an array per part (one parameter to send instead of some
-- thirty arrays); the notifications and deliveries go in in batch order (their ids too); the
-- outcomes are record_outcomes' arrays, written by the same fragment (DEC-1.7).
-- Every part counts the rows it wrote; any difference from the lengths of those arrays
-- (what the caller decided) fails the statement, so the COMMIT sent after it in the same
-- round trip does not run: the scheduler rolls back to its checkpoint and decides the
-- batch's events as batches of one (DEC-1.2)
WITH document AS MATERIALIZED (
    -- the batch's one parameter, named once: bound on the client, it is a literal in the text
    SELECT CAST(:batch AS jsonb) AS b
), new_keys AS (
    -- the keys first claimed in this batch, with the duplicates the batch itself made of them
    INSERT INTO scheduler.dedup_keys (key, notification_id, created_at, duplicate_count, last_duplicate_at,
                            duplicate_notification_id)
    SELECT k->>'key', k->>'notification_id', CAST(k->>'at' AS timestamptz), CAST(k->>'duplicates' AS integer),
           CAST(k->>'last_duplicate_at' AS timestamptz), k->>'duplicate_notification_id'
    FROM document, jsonb_array_elements(document.b->'new_keys') AS k
    -- the key's primary key still arbitrates: a key taken meanwhile is not counted below
    ON CONFLICT (key) DO NOTHING
    RETURNING key
), repeated_keys AS (
    -- keys taken before this batch: count the batch's duplicates, link the one suppressed_dedup row
    UPDATE scheduler.dedup_keys AS d
    SET duplicate_count = d.duplicate_count + CAST(r->>'duplicates' AS integer),
        last_duplicate_at = CAST(r->>'at' AS timestamptz),
        duplicate_notification_id = coalesce(d.duplicate_notification_id, r->>'notification_id')
    FROM document, jsonb_array_elements(document.b->'repeated_keys') AS r
    -- only as the read saw it: a new suppressed_dedup row exactly when the key had none
    WHERE d.key = r->>'key'
      -- through the primary key whatever the planner's costs say, as outcomes_by_key (DEC-PLANS)
      AND d.key = ANY(ARRAY(SELECT k->>'key' FROM document, jsonb_array_elements(document.b->'repeated_keys') AS k))
      AND (d.duplicate_notification_id IS NULL) = (r->>'notification_id' IS NOT NULL)
    RETURNING d.key
), notification AS (
    INSERT INTO scheduler.notifications (id, user_id, community_id, rule_id, kind, scenario, time_scope,
                               dedup_key, title, body, status, reason, source,
                               scheduled_event_id, created_at)
    SELECT n.e->>'id', n.e->>'user_id', n.e->>'community_id', n.e->>'rule_id', n.e->>'kind',
           n.e->>'scenario', n.e->>'time_scope', n.e->>'dedup_key', n.e->>'title', n.e->>'body',
           n.e->>'status', n.e->>'reason', n.e->>'source', n.e->>'scheduled_event_id',
           CAST(n.e->>'now' AS timestamptz)
    FROM document, jsonb_array_elements(document.b->'notifications') WITH ORDINALITY AS n(e, ord)
    ORDER BY n.ord
    RETURNING id
), delivery AS (
    -- every channel's deliveries of the sent notifications, in batch order (their ids too)
    -- (an outbox channel's row is queued with its idempotency key and message, due at once:
    -- DEC-OUTBOX; the other rows have none)
    INSERT INTO scheduler.deliveries (notification_id, user_id, channel, status, detail, created_at,
                                      idempotency_key, message, next_attempt_at, updated_at)
    SELECT d.e->>'notification_id', d.e->>'user_id', d.e->>'channel', d.e->>'status', d.e->>'detail',
           CAST(d.e->>'now' AS timestamptz), d.e->>'idempotency_key', d.e->'message',
           CAST(d.e->>'next_attempt_at' AS timestamptz), CAST(d.e->>'now' AS timestamptz)
    FROM document, jsonb_array_elements(document.b->'deliveries') WITH ORDINALITY AS d(e, ord)
    ORDER BY d.ord
    RETURNING id
), push_delivery AS (
    -- web push (PUSH-6): one queued row per unexpired subscription of the notification's
    -- participant, each keyed by the notification's web_push key and the subscription; how
    -- many is the subscriptions' (none: no row), so these are not among the counts checked below
    INSERT INTO scheduler.deliveries (notification_id, user_id, channel, status, detail, created_at,
                                      idempotency_key, message, next_attempt_at, updated_at, push_subscription_id)
    SELECT p.e->>'notification_id', p.e->>'user_id', p.e->>'channel', 'queued', NULL,
           CAST(p.e->>'now' AS timestamptz), (p.e->>'idempotency_key') || '.' || s.id, p.e->'message',
           CAST(p.e->>'next_attempt_at' AS timestamptz), CAST(p.e->>'now' AS timestamptz), s.id
    FROM document, jsonb_array_elements(document.b->'push_deliveries') WITH ORDINALITY AS p(e, ord)
    JOIN scheduler.push_subscriptions AS s
      ON s.user_id = p.e->>'user_id'
     AND (s.expiration_time IS NULL OR s.expiration_time > CAST(p.e->>'now' AS timestamptz))
    ORDER BY p.ord, s.id
    RETURNING id
), outcomes AS (
    {{batch_outcomes}}
), outcome AS (
    -- exactly record_outcomes' write: dispatched with its time and no error, or failed with
    -- the reason, or pending, held until its not_before (QUIET-2)
    {{write_outcomes}}
    {{outcomes_by_key}}
    RETURNING e.id
), wrote AS (
    SELECT (SELECT count(*) FROM new_keys) AS new_keys,
           (SELECT count(*) FROM repeated_keys) AS repeated_keys,
           (SELECT count(*) FROM notification) AS notifications,
           (SELECT count(*) FROM delivery) AS deliveries,
           (SELECT count(*) FROM outcome) AS outcomes
), decided AS (
    SELECT jsonb_array_length(b->'new_keys') AS new_keys,
           jsonb_array_length(b->'repeated_keys') AS repeated_keys,
           jsonb_array_length(b->'notifications') AS notifications,
           jsonb_array_length(b->'deliveries') AS deliveries,
           cardinality(CAST(:ids AS text[])) AS outcomes
    FROM document AS batch
)
SELECT w.*,
       -- CASE runs only the branch it takes; the cast of a text that is no number is the
       -- error (its message names the counts), raised only when the counts differ
       CASE WHEN (w.new_keys, w.repeated_keys, w.notifications, w.deliveries, w.outcomes)
                 = (d.new_keys, d.repeated_keys, d.notifications, d.deliveries, d.outcomes)
            THEN 0
            ELSE CAST(format('the batch''s write differs from the decisions: wrote %s keys, %s repeated keys, '
                             '%s notifications, %s deliveries, %s outcomes', w.new_keys, w.repeated_keys,
                             w.notifications, w.deliveries, w.outcomes) AS integer)
       END AS differs
FROM wrote AS w CROSS JOIN decided AS d;

-- name: claim_by_due_order
-- For the rest of this transaction (a claim of its own), no bitmap scans and no hash or merge joins: the claim after it walks ix_deliveries_due in order, stops at its limit, and finds each row's notification and event by primary key.
-- Without the first, a table whose statistics lag a burst (a few rows estimated due, thousands
-- queued) is read by a bitmap scan of every due row, all of them sorted for the first
-- :limit: a claim's cost grew with the backlog (DEC-OUTBOX-STORAGE)
SELECT set_config('enable_bitmapscan', 'off', true),
       -- without these, a claim estimated at a few hundred rows joins them to deliveries,
       -- notifications and scheduled_events by hashing a sequential scan of each whole table:
       -- a burst's every claim read everything decided so far (DEC-PLANS)
       set_config('enable_hashjoin', 'off', true),
       set_config('enable_mergejoin', 'off', true);

-- name: claim_due_deliveries
-- Lease up to :limit due outbox rows (queued or retrying, next_attempt_at reached by :now, no live lease) to :worker until :lease_until, oldest due first, counting the attempt (DEC-OUTBOX).
-- FOR UPDATE SKIP LOCKED: two workers claiming at once take different rows; the lease
-- outlives the claim's short transaction, so a worker that dies with rows in hand leaves
-- them to whoever claims after :lease_until. The attempt is counted here, before the send:
-- an attempt cut short by a crash is counted too, so a row that kills its worker still
-- reaches SCHEDULER_DELIVERY_MAX_ATTEMPTS. The trigger time is the scheduled event's
-- trigger_at (the notification's created_at for a live event or a row retention deleted).
WITH due AS MATERIALIZED (
    SELECT id FROM scheduler.deliveries
    WHERE status IN ('queued', 'retrying') AND next_attempt_at <= :now
      AND (lease_until IS NULL OR lease_until <= :now)
    ORDER BY next_attempt_at, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), leased AS (
    UPDATE scheduler.deliveries AS d
    SET lease_until = :lease_until, leased_by = :worker, attempts = d.attempts + 1, updated_at = :now
    FROM due WHERE d.id = due.id
    RETURNING d.id, d.idempotency_key, d.channel, d.notification_id, d.user_id, d.message, d.attempts,
              d.last_delay_seconds, d.created_at, d.next_attempt_at, d.push_subscription_id
)
SELECT l.id, l.idempotency_key, l.channel, l.notification_id, l.user_id, l.message, l.attempts,
       l.last_delay_seconds, l.created_at, coalesce(e.trigger_at, l.created_at) AS triggered_at,
       -- a web_push row's subscription as it stands (none once it was removed: PUSH-8)
       s.id AS push_subscription_id, s.endpoint AS push_endpoint, s.p256dh AS push_p256dh,
       s.auth AS push_auth, s.updated_at AS push_subscribed_at
FROM leased AS l
LEFT JOIN scheduler.notifications AS n ON n.id = l.notification_id
LEFT JOIN scheduler.scheduled_events AS e ON e.id = n.scheduled_event_id
LEFT JOIN scheduler.push_subscriptions AS s ON s.id = l.push_subscription_id
ORDER BY l.next_attempt_at, l.id;

-- name: queue_deliveries
-- Queue a host dispatcher's outbox messages in the dispatch transaction (OUTBOX-7): each row queued and due at :now, or undeliverable at once with its error (a channel without a sender, OUTBOX-8). Returns the ids written.
-- a message queued again (the same message id on the same channel: the same idempotency key)
-- is the row already there, so a repeated call queues it once
INSERT INTO scheduler.deliveries (notification_id, user_id, channel, status, created_at, idempotency_key, message,
                                  next_attempt_at, last_error, updated_at)
SELECT m->>'notification_id', m->>'user_id', m->>'channel', m->>'status', CAST(:now AS timestamptz),
       m->>'idempotency_key', m->'message', CASE WHEN m->>'status' = 'queued' THEN CAST(:now AS timestamptz) END,
       m->>'last_error', CAST(:now AS timestamptz)
FROM jsonb_array_elements(CAST(:messages AS jsonb)) WITH ORDINALITY AS q(m, ord)
ORDER BY q.ord
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: record_delivery_attempts
-- Record what attempts made of their outbox rows (delivery.record), each only while :worker still holds its lease for that attempt; the lease ends. Returns the ids recorded.
-- a worker whose lease lapsed (another took the row over and counted another attempt) records
-- nothing: the newer attempt's record is the row's
UPDATE scheduler.deliveries AS d
SET status = r->>'status', attempts = CAST(r->>'attempts' AS integer),
    next_attempt_at = CAST(r->>'next_attempt_at' AS timestamptz), last_error = r->>'last_error',
    last_delay_seconds = CAST(r->>'delay_seconds' AS double precision),
    delivered_at = CAST(r->>'delivered_at' AS timestamptz),
    provider_status = CAST(r->>'provider_status' AS integer), provider_answer = r->>'provider_answer',
    lease_until = NULL, leased_by = NULL, updated_at = CAST(r->>'at' AS timestamptz)
FROM jsonb_array_elements(CAST(:records AS jsonb)) AS r
WHERE d.id = CAST(r->>'id' AS bigint) AND d.leased_by = :worker
  AND d.attempts = CAST(r->>'attempts' AS integer)
RETURNING d.id;

-- name: release_delivery_leases
-- Give back outbox rows :worker claimed and never sent (a stopping worker's rows claimed ahead), each only while its lease and attempt are still the worker's: the lease ends and the attempt counted at the claim is taken back. Returns the ids released.
-- the next claim, this replica's or another's, sends them at once as the same attempt, where
-- a lease left to run out would hold them back for the lease
UPDATE scheduler.deliveries AS d
SET lease_until = NULL, leased_by = NULL, attempts = d.attempts - 1
FROM jsonb_array_elements(CAST(:rows AS jsonb)) AS r
WHERE d.id = CAST(r->>'id' AS bigint) AND d.leased_by = :worker
  AND d.attempts = CAST(r->>'attempts' AS integer)
RETURNING d.id;

-- name: remove_gone_push_subscriptions
-- Remove the subscriptions a push service answered 404 or 410 for (PUSH-8), each only as it was when its push was sent: a browser that subscribed again since keeps its new keys. Returns the ids removed.
DELETE FROM scheduler.push_subscriptions AS s
USING jsonb_array_elements(CAST(:gone AS jsonb)) AS g
WHERE s.id = CAST(g->>'id' AS bigint) AND s.updated_at = CAST(g->>'subscribed_at' AS timestamptz)
RETURNING s.id;

-- name: upsert_push_subscription
-- Store a participant's push subscription by its endpoint (PUSH-2): a new row, or the same endpoint's again with its keys, expiry and owner replaced; then keep the participant's :keep most recently updated. The row, whether it is new, and how many older ones were removed.
-- every part sees the table as it was before the statement: the row upserted is kept by its
-- id, the others are the participant's before it
WITH upserted AS (
    INSERT INTO scheduler.push_subscriptions (user_id, endpoint, p256dh, auth, expiration_time, created_at, updated_at)
    VALUES (:user_id, :endpoint, :p256dh, :auth, :expiration_time, :now, :now)
    ON CONFLICT (endpoint) DO UPDATE
    SET user_id = EXCLUDED.user_id, p256dh = EXCLUDED.p256dh, auth = EXCLUDED.auth,
        expiration_time = EXCLUDED.expiration_time, updated_at = EXCLUDED.updated_at
    RETURNING id, endpoint, expiration_time, created_at, updated_at, (xmax = 0) AS created
), others AS (
    SELECT id FROM scheduler.push_subscriptions
    WHERE user_id = :user_id AND id NOT IN (SELECT id FROM upserted)
    ORDER BY updated_at DESC, id DESC
    OFFSET CAST(:keep AS integer) - 1
), evicted AS (
    DELETE FROM scheduler.push_subscriptions AS s USING others WHERE s.id = others.id RETURNING s.id
)
SELECT u.id, u.endpoint, u.expiration_time, u.created_at, u.updated_at, u.created,
       (SELECT count(*) FROM evicted) AS evicted
FROM upserted AS u;

-- name: delete_push_subscriptions
-- Remove a participant's push subscription of :endpoint, or every one of theirs when :endpoint is NULL (PUSH-3); the ids removed.
DELETE FROM scheduler.push_subscriptions
WHERE user_id = :user_id AND (CAST(:endpoint AS text) IS NULL OR endpoint = :endpoint)
RETURNING id;

-- name: participant_push_subscriptions
-- A participant's push subscriptions, oldest first (no keys).
SELECT id, endpoint, expiration_time, created_at, updated_at
FROM scheduler.push_subscriptions
WHERE user_id = :user_id
ORDER BY id;

-- name: list_deliveries
-- The delivery log and the outbox for an operator, newest first, each filter optional (GET /admin/deliveries).
SELECT id, notification_id, user_id, channel, status, detail, created_at, idempotency_key, attempts,
       next_attempt_at, lease_until, last_error, delivered_at, provider_status, provider_answer, updated_at
FROM scheduler.deliveries
WHERE (CAST(:status AS text) IS NULL OR status = :status)
  AND (CAST(:channel AS text) IS NULL OR channel = :channel)
  AND (CAST(:user_id AS text) IS NULL OR user_id = :user_id)
  AND (CAST(:notification_id AS text) IS NULL OR notification_id = :notification_id)
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: retry_delivery
-- Queue one retrying or undeliverable outbox row again by hand, due at :now with its attempts counted afresh, unless a worker's lease on it is live (OUTBOX-10). Returns the row.
UPDATE scheduler.deliveries
SET status = 'queued', attempts = 0, next_attempt_at = :now, lease_until = NULL, leased_by = NULL,
    last_delay_seconds = NULL, updated_at = :now
WHERE id = :id AND status IN ('retrying', 'undeliverable') AND (lease_until IS NULL OR lease_until <= :now)
RETURNING id, notification_id, user_id, channel, status, detail, created_at, idempotency_key, attempts,
          next_attempt_at, lease_until, last_error, delivered_at, provider_status, provider_answer, updated_at;

-- name: get_delivery
-- One row of deliveries by its id, for an operator.
SELECT id, notification_id, user_id, channel, status, detail, created_at, idempotency_key, attempts,
       next_attempt_at, lease_until, last_error, delivered_at, provider_status, provider_answer, updated_at
FROM scheduler.deliveries WHERE id = :id;

-- name: list_retryable_deliveries
-- The outbox rows an operator may retry (retrying, undeliverable), newest first, before an optional id, each filter optional (the console, OUTBOX-9).
SELECT id, notification_id, user_id, channel, status, detail, created_at, idempotency_key, attempts,
       next_attempt_at, lease_until, last_error, delivered_at, provider_status, provider_answer, updated_at
FROM scheduler.deliveries
WHERE status IN ('retrying', 'undeliverable') AND status = ANY(CAST(:statuses AS text[]))
  AND (CAST(:channel AS text) IS NULL OR channel = :channel)
  AND (CAST(:user_id AS text) IS NULL OR user_id = :user_id)
  AND (CAST(:before_id AS bigint) IS NULL OR id < :before_id)
ORDER BY id DESC
LIMIT :limit;

-- name: count_retryable_deliveries
-- The dry run of a bulk retry: how many retrying or undeliverable rows match, none leased live, counting at most one past the cap (OUTBOX-11).
SELECT count(*) AS count FROM (
    SELECT 1 FROM scheduler.deliveries
    WHERE status IN ('retrying', 'undeliverable') AND status = ANY(CAST(:statuses AS text[]))
      AND (CAST(:channel AS text) IS NULL OR channel = :channel)
      AND (CAST(:user_id AS text) IS NULL OR user_id = :user_id)
      AND (lease_until IS NULL OR lease_until <= :now)
    LIMIT :cap + 1
) AS matching;

-- name: retry_deliveries_chunk
-- One chunk of a bulk retry: matching rows unchanged since the dry run, after an id, queued again due at :now with their attempts counted afresh; rows a worker holds are skipped (OUTBOX-11). Returns the ids.
WITH chosen AS (
    SELECT id FROM scheduler.deliveries
    WHERE status IN ('retrying', 'undeliverable') AND status = ANY(CAST(:statuses AS text[]))
      AND (CAST(:channel AS text) IS NULL OR channel = :channel)
      AND (CAST(:user_id AS text) IS NULL OR user_id = :user_id)
      AND (lease_until IS NULL OR lease_until <= :now)
      AND updated_at <= :as_of AND id > :after_id
    ORDER BY id
    LIMIT :chunk
    FOR UPDATE SKIP LOCKED
)
UPDATE scheduler.deliveries AS d
SET status = 'queued', attempts = 0, next_attempt_at = :now, lease_until = NULL, leased_by = NULL,
    last_delay_seconds = NULL, updated_at = :now
FROM chosen WHERE d.id = chosen.id
RETURNING d.id;

-- name: outbox_gauges
-- The outbox's depth by status (queued and retrying) and the age of its oldest queued row at :now, in seconds.
SELECT (SELECT count(*) FROM scheduler.deliveries WHERE status = 'queued') AS queued,
       (SELECT count(*) FROM scheduler.deliveries WHERE status = 'retrying') AS retrying,
       (SELECT extract(epoch FROM CAST(:now AS timestamptz) - min(created_at))
        FROM scheduler.deliveries WHERE status IN ('queued', 'retrying')) AS oldest_seconds;

-- name: delete_old_notifications
-- Delete up to a batch of notifications created before the cutoff with their deliveries, keeping every notification one of whose deliveries is queued, retrying or undeliverable; and up to a batch of a host dispatcher's delivered outbox rows (no notification) written before it (RET-8). Returns the counts.
-- each its own short transaction, rows a writer holds skipped (FOR UPDATE SKIP LOCKED); the
-- statement's CTEs share one snapshot, so a notification deleted here is never a host's row
WITH doomed AS (
    SELECT n.id FROM scheduler.notifications AS n
    WHERE n.created_at < :cutoff
      AND NOT EXISTS (SELECT 1 FROM scheduler.deliveries AS d
                      WHERE d.notification_id = n.id AND d.status IN ('queued', 'retrying', 'undeliverable'))
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
), host_rows AS (
    SELECT d.id FROM scheduler.deliveries AS d
    WHERE d.status = 'delivered' AND d.created_at < :cutoff
      AND NOT EXISTS (SELECT 1 FROM scheduler.notifications AS n WHERE n.id = d.notification_id)
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
), their_deliveries AS (
    DELETE FROM scheduler.deliveries AS d USING doomed WHERE d.notification_id = doomed.id RETURNING d.id
), host_deliveries AS (
    DELETE FROM scheduler.deliveries AS d USING host_rows WHERE d.id = host_rows.id RETURNING d.id
), notes AS (
    DELETE FROM scheduler.notifications AS n USING doomed WHERE n.id = doomed.id RETURNING n.id
)
SELECT (SELECT count(*) FROM notes) AS notifications,
       (SELECT count(*) FROM their_deliveries) + (SELECT count(*) FROM host_deliveries) AS deliveries,
       (SELECT count(*) FROM host_rows) AS host_rows;

-- name: oldest_due_delivery
-- How long the outbox row due the longest has waited at :now, in seconds (queued, or retrying past its next attempt); NULL when none is due (HEALTH-4).
-- the first entry of ix_deliveries_due, whatever the outbox holds
SELECT extract(epoch FROM CAST(:now AS timestamptz) - min(next_attempt_at)) AS seconds
FROM scheduler.deliveries
WHERE status IN ('queued', 'retrying') AND next_attempt_at <= :now;

-- name: list_notifications
-- Participants' notifications for an operator, newest first.
SELECT id, user_id, community_id, rule_id, kind, scenario, time_scope, dedup_key, title, body,
       status, reason, source, scheduled_event_id, created_at
FROM scheduler.notifications
WHERE (CAST(:user_id AS text) IS NULL OR user_id = :user_id)
  AND (CAST(:status AS text) IS NULL OR status = :status)
ORDER BY created_at DESC, id
LIMIT :limit;

-- ---------------------------------------------------------------------------------------
-- Operations: heartbeats, metrics gauges, the console, bulk reset, audit.
-- ---------------------------------------------------------------------------------------

-- name: upsert_heartbeat
-- Record this replica's heartbeat after a poll (one row per process, rewritten in place).
INSERT INTO scheduler.scheduler_replicas (replica_id, name, host, pid, mode, poll_seconds, started_at,
                                last_poll_at, seen_at, last_error, consecutive_failures,
                                polls, dispatched, failed, expired)
VALUES (:replica_id, :name, :host, :pid, :mode, :poll_seconds, :started_at,
        :last_poll_at, :now, :last_error, :consecutive_failures, :polls, :dispatched, :failed, :expired)
ON CONFLICT (replica_id) DO UPDATE
SET mode = EXCLUDED.mode, poll_seconds = EXCLUDED.poll_seconds,
    last_poll_at = EXCLUDED.last_poll_at, seen_at = EXCLUDED.seen_at,
    last_error = EXCLUDED.last_error, consecutive_failures = EXCLUDED.consecutive_failures,
    polls = EXCLUDED.polls, dispatched = EXCLUDED.dispatched, failed = EXCLUDED.failed,
    expired = EXCLUDED.expired;

-- name: delete_replica
-- Remove this replica's heartbeat when its loop stops cleanly.
DELETE FROM scheduler.scheduler_replicas WHERE replica_id = :replica_id;

-- name: delete_gone_replicas
-- Forget replicas whose last heartbeat is older than :cutoff (retention's run: silent for the replica retention).
DELETE FROM scheduler.scheduler_replicas WHERE seen_at < :cutoff;

-- name: list_replicas
-- Every replica's heartbeat with whether it is stale (silent for three of its poll intervals):
-- /admin/replicas, the console and the scheduler_replicas gauge (the table is one row per process).
SELECT replica_id, name, host, pid, mode, poll_seconds, started_at, last_poll_at, seen_at,
       last_error, consecutive_failures, polls, dispatched, failed, expired,
       -- stale by the reader's clock: no heartbeat for three intervals (at least 1 s each)
       seen_at < CAST(:now AS timestamptz)
                 - 3 * greatest(poll_seconds, 1.0) * interval '1 second' AS stale
FROM scheduler.scheduler_replicas
ORDER BY name, host, pid, replica_id;

-- name: backlog_gauges
-- Due pending rows and the oldest one's due time (its trigger_at, or a held row's not_before), read from the pending partial index only.
SELECT count(*) AS backlog, min(due_at) AS oldest_trigger_at
FROM scheduler.scheduled_events
-- the predicate of ix_scheduled_events_pending_due: an index-only scan, no terminal row read;
-- a row held in quiet hours is not due, so not backlog, until its not_before
WHERE status = 'pending'
  AND due_at <= :now;

-- name: count_failed
-- How many rows are failed, read from the failed partial index only, at most :cap + 1 of them (past :cap the caller estimates).
SELECT count(*) FROM (
    SELECT 1 FROM scheduler.scheduled_events WHERE status = 'failed'
    -- the index's own order: a walk of ix_scheduled_events_failed that stops at the cap, never
    -- a scan of the table that stops after cap failed rows among however many others
    ORDER BY updated_at, id
    -- failed rows are never deleted by retention, so they pile up: counting stops past the
    -- cap, and the count's cost is bounded whatever the table holds
    LIMIT :cap + 1
) AS counted;

-- name: count_pending
-- How many rows are pending (due or not), read from the pending partial index only, at most :cap + 1 of them (past :cap the caller estimates).
SELECT count(*) FROM (
    SELECT 1 FROM scheduler.scheduled_events WHERE status = 'pending'
    -- the order of ix_scheduled_events_pending_due: a walk of that index, stopped at the cap
    ORDER BY due_at, id
    -- reminders scheduled months ahead are pending too: counting stops past the cap
    LIMIT :cap + 1
) AS counted;

-- name: count_events_by_status
-- How many rows are in each status of :statuses (the EventStatus enum), zero included: one GROUP BY (small tables only: it reads them whole).
SELECT s.status, count(e.id) AS count
FROM unnest(CAST(:statuses AS text[])) AS s(status)
LEFT JOIN scheduler.scheduled_events AS e ON e.status = s.status
GROUP BY s.status;

-- name: estimate_events_by_status
-- ANALYZE's statistics of the status column (most common values, their frequencies, the null fraction) and the table's row estimate; no row read.
SELECT CAST(greatest(c.reltuples, 0) AS bigint) AS reltuples,
       CAST(CAST(st.most_common_vals AS text) AS text[]) AS statuses,
       st.most_common_freqs AS freqs,
       st.null_frac
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_stats AS st
       ON st.schemaname = n.nspname AND st.tablename = c.relname AND st.attname = 'status'
WHERE c.oid = CAST('scheduler.scheduled_events' AS regclass);

-- name: estimate_events
-- The planner's row estimate of scheduled_events (kept by ANALYZE and autovacuum; -1 before the first).
SELECT CAST(reltuples AS bigint) FROM pg_class WHERE oid = CAST('scheduler.scheduled_events' AS regclass);

-- name: lateness_percentiles
-- p50 and p99 of dispatched_at - due_at (trigger_at, or the end of the quiet hours that held the row) over the dispatches since :since.
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lateness) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY lateness) AS p99,
       count(*) AS dispatched
FROM (
    SELECT extract(epoch FROM dispatched_at - due_at) AS lateness
    FROM scheduler.scheduled_events
    -- the window on ix_scheduled_events_updated_at: a row's updated_at is never before its
    -- dispatched_at (it is the time of its last change), so this reads only the window's rows
    WHERE updated_at >= :since
      AND status = 'dispatched'
      AND dispatched_at >= :since
      AND dispatched_at <= :now
) AS recent;

-- name: failures_by_kind
-- The latest :sample failures of the window grouped by the kind of last_error (the text before its first colon).
SELECT split_part(coalesce(last_error, ''), ':', 1) AS kind, count(*) AS count, max(updated_at) AS latest
FROM (
    SELECT last_error, updated_at
    FROM scheduler.scheduled_events
    -- ix_scheduled_events_failed on (updated_at, id): the window's failures, newest first
    WHERE status = 'failed'
      AND updated_at >= :since
    ORDER BY updated_at DESC
    -- a failure storm is summarised by its latest rows, so the overview's cost stays bounded
    LIMIT :sample
) AS recent
GROUP BY 1
ORDER BY count(*) DESC, kind
LIMIT 20;

-- name: count_failed_since
-- How many rows failed in the window (an index-only count on the failed partial index).
SELECT count(*) FROM scheduler.scheduled_events WHERE status = 'failed' AND updated_at >= :since;

-- name: filter_events_page
-- One page of the console's events list: the filter, newest change first, keyset-paginated.
SELECT id, event_type, user_id, community_id, external_key, trigger_at, status, last_error,
       updated_at, dispatched_at, not_before, due_at
FROM scheduler.scheduled_events
WHERE {{event_filter}}
  -- keyset: strictly after the last row of the previous page (no OFFSET)
  AND (CAST(:after_at AS timestamptz) IS NULL OR (updated_at, id) < (:after_at, :after_id))
ORDER BY updated_at DESC, id DESC
LIMIT :limit;

-- name: filter_pending_page
-- One page of pending rows for the console: the filter, next due first (the claim's order), keyset-paginated.
SELECT id, event_type, user_id, community_id, external_key, trigger_at, status, last_error,
       updated_at, dispatched_at, not_before, due_at
FROM scheduler.scheduled_events
-- the pending partial index, walked in its own (due_at, id) order
WHERE status = 'pending'
  AND {{event_filter}}
  -- keyset: strictly after the last row of the previous page (no OFFSET)
  AND (CAST(:after_at AS timestamptz) IS NULL OR (due_at, id) > (:after_at, :after_id))
ORDER BY due_at, id
LIMIT :limit;

-- name: count_filtered_events
-- How many rows match the filter and a bulk command's source statuses now (its dry-run count), capped at :cap + 1.
SELECT count(*) FROM (
    SELECT 1 FROM scheduler.scheduled_events
    WHERE {{event_filter}}
      -- :sources: the statuses the command acts on, so the count is of what it would touch
      AND status = ANY(CAST(:sources AS text[]))
    -- counting past the cap would only tell the operator to narrow the filter
    LIMIT :cap + 1
) AS matching;

-- name: change_filtered_chunk
-- Reset or cancel (:to, pending or cancelled) the next chunk of rows that still match the filter, skipping rows a poll has locked.
WITH chunk AS (
    SELECT id FROM scheduler.scheduled_events
    -- the filter is evaluated again here: a row that stopped matching since the count is not touched
    WHERE {{event_filter}}
      -- only the command's source statuses (a reset leaves a pending row its place in the claim order)
      AND status = ANY(CAST(:sources AS text[]))
      -- only rows as the dry run saw them: a row that changed since then was not in its count
      AND updated_at <= :as_of
      -- keyset over id, so each row is visited once even when a changed row still matches
      AND id > :after_id
    ORDER BY id
    LIMIT :chunk
    -- a row a replica is dispatching right now is skipped, never waited for: the loop
    -- is not held up, and that row's new status decides for itself
    FOR UPDATE SKIP LOCKED
)
UPDATE scheduler.scheduled_events AS e
SET status = CAST(:to AS text), dispatched_at = NULL,
    -- a reset clears the error; a cancel keeps it (why the row had failed stays visible)
    last_error = CASE WHEN CAST(:to AS text) = 'pending' THEN NULL ELSE e.last_error END,
    -- a reset re-arms the row at its trigger_at: no hold carries over (DEC-LOCAL-TIME)
    not_before = CASE WHEN CAST(:to AS text) = 'pending' THEN NULL ELSE e.not_before END,
    updated_at = :now
FROM chunk
WHERE e.id = chunk.id
RETURNING e.id;

-- name: insert_operator_action
-- Record one operator action in the audit trail and return its id.
INSERT INTO scheduler.operator_actions (at, actor, source, action, event_id, filter, count, reason)
VALUES (:now, :actor, :source, :action, :event_id, CAST(:filter AS jsonb), :count, :reason)
RETURNING id;

-- name: set_operator_action_count
-- Set the number of rows an action touched, once its chunks are done.
UPDATE scheduler.operator_actions SET count = :count WHERE id = :id;

-- name: link_action_events
-- Remember which rows an action touched (for each event's history).
INSERT INTO scheduler.operator_action_events (action_id, event_id)
SELECT :action_id, unnest(CAST(:event_ids AS text[]));

-- name: list_operator_actions
-- The audit trail, newest first, keyset-paginated by id.
SELECT id, at, actor, source, action, event_id, filter, count, reason
FROM scheduler.operator_actions
WHERE (CAST(:before_id AS bigint) IS NULL OR id < :before_id)
ORDER BY id DESC
LIMIT :limit;

-- name: event_actions
-- The operator actions that touched one event, newest first.
SELECT a.id, a.at, a.actor, a.source, a.action, a.filter, a.count, a.reason
FROM scheduler.operator_action_events AS l
JOIN scheduler.operator_actions AS a ON a.id = l.action_id
WHERE l.event_id = :event_id
ORDER BY a.id DESC
LIMIT 100;

-- name: event_notifications
-- The notifications one scheduled event produced, oldest first.
SELECT id, rule_id, kind, title, body, status, reason, created_at
FROM scheduler.notifications
WHERE scheduled_event_id = :event_id
ORDER BY created_at, id
LIMIT 100;

-- The event lifecycle: cancel, history, retention, the participant's inbox.
-- ---------------------------------------------------------------------------------------

-- name: set_change_context
-- Name the change and its actor for the history trigger, until this transaction ends.
SELECT set_config('scheduler.change', :change, true), set_config('scheduler.actor', :actor, true);

-- name: lock_event_by_id
-- Lock one row for a cancel; waits for a batch that is dispatching it, then reads its newest version.
SELECT * FROM scheduler.scheduled_events WHERE id = :id FOR UPDATE;

-- name: lock_event_by_key
-- Lock the row of an external key for a cancel, as lock_event_by_id does.
SELECT * FROM scheduler.scheduled_events WHERE external_key = :external_key FOR UPDATE;

-- name: cancel_event
-- Withdraw one row the caller has locked, if its status allows: terminal `cancelled`, never claimed (the claim reads pending only).
UPDATE scheduler.scheduled_events
SET status = 'cancelled', dispatched_at = NULL, updated_at = :now
-- :sources is CANCELLABLE (pending, failed); the status test keeps a dispatched row dispatched
WHERE id = :id AND status = ANY(CAST(:sources AS text[]))
RETURNING *;

-- name: event_history
-- Every change of one scheduled event, oldest first (the trigger appends them).
SELECT id, event_id, at, change, actor, status, changes
FROM scheduler.scheduled_event_history
WHERE event_id = :id
ORDER BY id;

-- name: try_retention_lock
-- Elect the one replica that runs retention now, until this transaction ends (never waits).
-- transaction-level, so it also holds behind a transaction-pooling PgBouncer
SELECT pg_try_advisory_xact_lock(:key);

-- name: claim_maintenance_run
-- Start a periodic task's run unless one started less than :interval_seconds ago (by :now).
INSERT INTO scheduler.scheduler_maintenance (task, last_run_at)
VALUES (:task, :now)
ON CONFLICT (task) DO UPDATE SET last_run_at = EXCLUDED.last_run_at
-- a run started within the interval (by the injected clock) keeps its time: no new run
WHERE scheduler_maintenance.last_run_at <= CAST(:now AS timestamptz) - make_interval(secs => :interval_seconds)
   -- a clock that went back (a frozen test clock, a corrected host) must not stall retention forever
   OR scheduler_maintenance.last_run_at > :now
RETURNING last_run_at;

-- name: delete_expired_events
-- Delete up to :batch_size rows dispatched, cancelled or expired before :cutoff, with their history.
WITH doomed AS (
    SELECT id FROM scheduler.scheduled_events
    -- only terminal successes, withdrawals and expiries (kept as long as dispatched rows,
    -- EXP-8): failed and pending rows are never deleted; ix_scheduled_events_finished holds
    -- exactly these rows, by updated_at
    WHERE status IN ('dispatched', 'cancelled', 'expired') AND updated_at < :cutoff
    ORDER BY updated_at
    -- a small batch: each runs in its own short transaction
    LIMIT :batch_size
    -- a row a re-post or a cancel is changing right now is left for the next run
    FOR UPDATE SKIP LOCKED
), history AS (
    DELETE FROM scheduler.scheduled_event_history WHERE event_id IN (SELECT id FROM doomed)
)
DELETE FROM scheduler.scheduled_events WHERE id IN (SELECT id FROM doomed)
RETURNING id;

-- name: lock_stream_order
-- Serialise stream numbering across replicas until commit, so stream order is commit order.
SELECT pg_advisory_xact_lock(:key);

-- name: number_for_stream
-- Give delivered notifications (a batch's) their places in the inbox stream, once each, and wake every replica's inbox (LISTEN :channel) with the newest number; the numbers given.
-- one statement, so the numbering is one round trip after the stream's order lock; the NOTIFY
-- is delivered with the commit (the numbers visible by then), and none is sent when nothing
-- was numbered (every id numbered already)
WITH numbered AS (
    UPDATE scheduler.notifications
    SET stream_seq = nextval('scheduler.notification_stream_seq')
    WHERE id = ANY(CAST(:ids AS text[])) AND stream_seq IS NULL
    RETURNING stream_seq
), announced AS (
    -- the payload is the newest number: a hub reads the table after its cursor, not the payload's rows
    SELECT pg_notify(:channel, CAST(max(stream_seq) AS text)) FROM numbered HAVING count(*) > 0
)
-- the filter is a one-time condition on a subquery: the NOTIFY runs once, before the rows
SELECT stream_seq FROM numbered
WHERE (SELECT count(*) FROM announced) >= 0;

-- name: unnumbered_for_stream
-- Sent notifications left without a stream number (their numbering failed after the commit), oldest first.
-- (the service's every sent notification is delivered in-app: the web channel is always on;
-- the partial index ix_notifications_unnumbered holds only these rows, so this is cheap when
-- there are none, as there almost always are)
SELECT id FROM scheduler.notifications
WHERE stream_seq IS NULL AND status = 'sent'
ORDER BY created_at, id
LIMIT :limit;

-- name: stream_tail
-- Streamed notifications after :after in stream order: every replica's live fan-out reads this.
SELECT id, user_id, community_id, rule_id, kind, scenario, time_scope, title, body,
       source, scheduled_event_id, created_at, stream_seq
FROM scheduler.notifications
WHERE stream_seq > :after
ORDER BY stream_seq
LIMIT :limit;

-- name: stream_head
-- The newest stream number (0 when nothing was streamed yet).
SELECT coalesce(max(stream_seq), 0) FROM scheduler.notifications WHERE stream_seq IS NOT NULL;

-- name: participant_stream_after
-- One participant's streamed notifications after :after, in stream order (a Last-Event-ID replay).
SELECT id, user_id, community_id, rule_id, kind, scenario, time_scope, title, body,
       source, scheduled_event_id, created_at, stream_seq
FROM scheduler.notifications
WHERE user_id = :user_id AND stream_seq > :after
ORDER BY stream_seq
LIMIT :limit;

-- name: participant_notifications
-- One participant's delivered notifications, newest first, after an optional keyset cursor.
SELECT id, user_id, community_id, rule_id, kind, scenario, time_scope, title, body,
       source, scheduled_event_id, created_at, stream_seq
FROM scheduler.notifications
WHERE user_id = :user_id
  -- only what reached the participant: suppressed and failed decisions are the operator's
  AND status = 'sent'
  -- keyset: strictly older than the last row of the previous page
  AND (CAST(:before_at AS timestamptz) IS NULL
       OR (created_at, id) < (CAST(:before_at AS timestamptz), CAST(:before_id AS text)))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- Sessions: the console's and the inbox's signed-in browsers.
-- ---------------------------------------------------------------------------------------

-- name: insert_web_session
-- Store a new session: only the hash of its secret id, with its absolute expiry and idle timeout.
INSERT INTO scheduler.web_sessions (id, secret_hash, subject, kind, created_at, expires_at, last_seen_at, idle_seconds, user_agent)
VALUES (:id, :secret_hash, :subject, :kind, :now, :expires_at, :now, :idle_seconds, :user_agent);

-- name: touch_web_session
-- Resolve a cookie: the session of that hash and kind if neither expired nor idle too long, marked seen now.
UPDATE scheduler.web_sessions
SET last_seen_at = greatest(last_seen_at, :now)
WHERE secret_hash = :secret_hash
  AND kind = :kind
  AND expires_at > :now
  AND last_seen_at + idle_seconds * interval '1 second' > :now
RETURNING id, subject, kind, created_at, expires_at, last_seen_at, idle_seconds, user_agent;

-- name: web_session_open
-- Whether a session is still open, without marking it seen (an open stream checks this as it runs).
SELECT 1 FROM scheduler.web_sessions
WHERE secret_hash = :secret_hash
  AND kind = :kind
  AND expires_at > :now
  AND last_seen_at + idle_seconds * interval '1 second' > :now;

-- name: delete_web_session_by_hash
-- Sign-out: delete the session of a cookie, so the cookie is refused by every replica from now on.
DELETE FROM scheduler.web_sessions WHERE secret_hash = :secret_hash RETURNING id;

-- name: delete_web_session
-- An admin ends a session by its public id.
DELETE FROM scheduler.web_sessions WHERE id = :id
RETURNING id, subject, kind, created_at, expires_at, last_seen_at, idle_seconds, user_agent;

-- name: list_web_sessions
-- The sessions still open (neither expired nor idle too long), most recently seen first.
SELECT id, subject, kind, created_at, expires_at, last_seen_at, idle_seconds, user_agent
FROM scheduler.web_sessions
WHERE expires_at > :now
  AND last_seen_at + idle_seconds * interval '1 second' > :now
  AND (CAST(:kind AS text) IS NULL OR kind = :kind)
ORDER BY last_seen_at DESC, id
LIMIT :limit;

-- name: purge_web_sessions
-- Delete sessions that ended by expiry or idleness (at each sign-in; the table stays small).
DELETE FROM scheduler.web_sessions
WHERE expires_at <= :now
   OR last_seen_at + idle_seconds * interval '1 second' <= :now;

-- name: migration_lock
-- Serialise migrators of one database (two replicas starting at once): held until the migration commits.
SELECT pg_advisory_xact_lock(hashtext('nudging-scheduler:migrate'));

-- name: relation_exists
-- Whether the relation :name (schema-qualified, e.g. scheduler.alembic_version) exists.
SELECT to_regclass(:name) IS NOT NULL;

-- name: schema_revisions
-- The revisions in the scheduler's own Alembic version table (in its schema).
SELECT version_num FROM scheduler.alembic_version ORDER BY version_num;

-- name: create_schema_ddl
-- A template (psycopg's sql.SQL, the schema as an identifier): the scheduler's schema, once.
CREATE SCHEMA IF NOT EXISTS {schema}

-- name: search_path_ddl
-- A template: this transaction's unqualified names (the migrations') resolve in the scheduler's schema only.
SELECT set_config('search_path', {schema_literal}, true)
