-- The benchmarks' own statements (loading and reshaping data), in the format of
-- src/scheduler/sql/queries.sql. The statements they measure come from that file.

-- name: load_terminal_events
-- :count rows already dispatched (nine in ten) or failed, due long before the pending ones.
INSERT INTO scheduler.scheduled_events (id, event_type, user_id, community_id, external_key, trigger_at,
                              facts, status, last_error, created_at, updated_at, dispatched_at)
SELECT 'old-' || g, 'commitment', 'user-' || (g % 5000), 'bench-community', NULL,
       CAST(:now AS timestamptz) - interval '1 day' - g * interval '1 second',
       jsonb_build_object('facts_version', '1', 'scenario', 'commitment_reminder',
                          'commitment', 'run the dishwasher at noon', 'date', '2026-11-28'),
       CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'dispatched' END,
       CASE WHEN g % 10 = 0 THEN 'RuntimeError: benchmark failure' END,
       CAST(:now AS timestamptz) - interval '2 days', CAST(:now AS timestamptz) - interval '1 day',
       CASE WHEN g % 10 = 0 THEN NULL ELSE CAST(:now AS timestamptz) - interval '1 day' END
FROM generate_series(1, :count) AS g;

-- name: load_pending_events
-- :count due pending rows for distinct users, each triggering the commitment reminder.
INSERT INTO scheduler.scheduled_events (id, event_type, user_id, community_id, external_key, trigger_at,
                              facts, status, created_at, updated_at)
SELECT gen_random_uuid()::text, 'commitment', :prefix || g, 'bench-community', NULL,
       CAST(:now AS timestamptz) - interval '1 hour' + g * interval '1 millisecond',
       jsonb_build_object('facts_version', '1', 'scenario', 'commitment_reminder',
                          'commitment', 'run the dishwasher at noon', 'date', CAST(:day AS text)),
       'pending', CAST(:now AS timestamptz) - interval '1 day', CAST(:now AS timestamptz) - interval '1 day'
FROM generate_series(1, :count) AS g;

-- name: load_held_events
-- :count pending rows held in their participants' quiet hours (QUIET-2): due long before the due rows by trigger_at, held until eight hours after :now (not_before), so a claim ordered by trigger_at would read every one of them first.
INSERT INTO scheduler.scheduled_events (id, event_type, user_id, community_id, external_key, trigger_at,
                              not_before, facts, status, created_at, updated_at)
SELECT gen_random_uuid()::text, 'commitment', 'held-' || g, 'bench-community', NULL,
       CAST(:now AS timestamptz) - interval '2 hours' + g * interval '1 millisecond',
       CAST(:now AS timestamptz) + interval '8 hours' + g * interval '1 millisecond',
       jsonb_build_object('facts_version', '1', 'scenario', 'commitment_reminder',
                          'commitment', 'run the dishwasher at noon', 'date', CAST(:day AS text)),
       'pending', CAST(:now AS timestamptz) - interval '1 day', CAST(:now AS timestamptz) - interval '1 day'
FROM generate_series(1, :count) AS g;

-- name: count_pending
-- Rows still pending (the drain is over when this reaches zero).
SELECT count(*) FROM scheduler.scheduled_events WHERE status = 'pending';

-- name: count_by_status
-- Rows per status, to check that a drain dispatched everything exactly once.
SELECT status, count(*) FROM scheduler.scheduled_events GROUP BY status;

-- name: drop_pending_index
-- The naive schema, step 1: no partial index on pending rows.
DROP INDEX scheduler.ix_scheduled_events_pending_due;

-- name: create_naive_index
-- The naive schema, step 2: the plain index on trigger_at a first design would have.
CREATE INDEX ix_bench_naive_trigger_at ON scheduler.scheduled_events (trigger_at);

-- name: drop_naive_index
-- Back from the naive schema.
DROP INDEX scheduler.ix_bench_naive_trigger_at;

-- name: create_pending_index
-- Back to the shipped schema (the migration's partial index).
CREATE INDEX ix_scheduled_events_pending_due ON scheduler.scheduled_events (trigger_at, id)
WHERE status = 'pending';

-- name: analyze_events
-- Fresh statistics, so the planner's choice is the one a settled table would get.
ANALYZE scheduler.scheduled_events;

-- name: count_notifications
-- Notifications per status after a full-path drain.
SELECT status, count(*) FROM scheduler.notifications GROUP BY status;

-- name: disable_autovacuum
-- Hold autovacuum off this table: the claim is measured as it is before a vacuum comes by.
ALTER TABLE scheduler.scheduled_events SET (autovacuum_enabled = false);

-- name: finish_oldest_events
-- Turn the :count oldest pending rows terminal by UPDATE, as drains do (nine in ten dispatched).
UPDATE scheduler.scheduled_events
SET status = CASE WHEN abs(hashtext(id)) % 10 = 0 THEN 'failed' ELSE 'dispatched' END,
    dispatched_at = :now, updated_at = :now
WHERE id IN (SELECT id FROM scheduler.scheduled_events ORDER BY trigger_at LIMIT :count);

-- name: vacuum_events
-- What autovacuum would do: remove the dead versions and their index entries.
VACUUM scheduler.scheduled_events;

-- name: checkpoint
-- Write out a bulk load's dirty pages before measuring.
CHECKPOINT;

-- name: console_recent_dispatches
-- Make :count dispatched rows recent (dispatched in the last hour, 0-10 minutes late) for the lateness figures.
UPDATE scheduler.scheduled_events
SET dispatched_at = CAST(:now AS timestamptz) - (id_n % 3600) * interval '1 second',
    trigger_at = CAST(:now AS timestamptz) - (id_n % 3600) * interval '1 second' - (id_n % 600) * interval '1 second',
    updated_at = CAST(:now AS timestamptz) - (id_n % 3600) * interval '1 second'
FROM (SELECT id, row_number() OVER () AS id_n FROM scheduler.scheduled_events
      WHERE status = 'dispatched' LIMIT :count) AS pick
WHERE scheduled_events.id = pick.id;

-- name: console_recent_failures
-- Make :count failed rows recent (within 24 hours) with a few kinds of last_error.
UPDATE scheduler.scheduled_events
SET updated_at = CAST(:now AS timestamptz) - (id_n % 86000) * interval '1 second',
    last_error = (ARRAY['missing_or_invalid_time_scope: date', 'RuntimeError: smtp down',
                        'OperationalError: connection reset'])[1 + id_n % 3]
FROM (SELECT id, row_number() OVER () AS id_n FROM scheduler.scheduled_events
      WHERE status = 'failed' LIMIT :count) AS pick
WHERE scheduled_events.id = pick.id;

-- name: vacuum_analyze_events
-- VACUUM (for the visibility map: index-only scans) and ANALYZE after a bulk load.
VACUUM (ANALYZE) scheduler.scheduled_events;

-- name: load_history_events
-- Rows :first..:last of a long history (bench scale): dispatched (nine in ten) or failed, one finished a second going back from two days before :now, for 5,000 participants.
INSERT INTO scheduler.scheduled_events (id, event_type, user_id, community_id, external_key, trigger_at,
                              facts, status, last_error, created_at, updated_at, dispatched_at)
SELECT 'old-' || g, 'commitment', 'user-' || (g % 5000), 'bench-community', NULL,
       -- due five minutes before it was finished: a history spread over g seconds, not one instant
       CAST(:now AS timestamptz) - interval '2 days' - g * interval '1 second' - interval '5 minutes',
       jsonb_build_object('facts_version', '1', 'scenario', 'commitment_reminder',
                          'commitment', 'run the dishwasher at noon', 'date', '2026-11-28'),
       CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'dispatched' END,
       CASE WHEN g % 10 = 0 THEN 'RuntimeError: benchmark failure' END,
       CAST(:now AS timestamptz) - interval '3 days' - g * interval '1 second',
       CAST(:now AS timestamptz) - interval '2 days' - g * interval '1 second',
       CASE WHEN g % 10 = 0 THEN NULL
            ELSE CAST(:now AS timestamptz) - interval '2 days' - g * interval '1 second' END
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g;

-- name: relation_sizes
-- The size on disk of scheduled_events, each of its indexes and the history table (bytes).
SELECT c.relname AS name, pg_relation_size(c.oid) AS bytes
FROM pg_class AS c
WHERE c.oid IN (CAST('scheduler.scheduled_events' AS regclass), CAST('scheduler.scheduled_event_history' AS regclass))
   OR c.oid IN (SELECT indexrelid FROM pg_index
                WHERE indrelid IN (CAST('scheduler.scheduled_events' AS regclass), CAST('scheduler.scheduled_event_history' AS regclass)))
ORDER BY c.relname;
