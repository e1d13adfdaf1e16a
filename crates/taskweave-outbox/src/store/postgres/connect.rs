//! Opening a [`PgStore`](super::PgStore): `connect` checks the tables' version and formats
//! every statement once with the table names.

use std::sync::Arc;

use sqlx::AssertSqlSafe;
use sqlx::postgres::PgPool;

use super::migration::LATEST_VERSION;
use super::schema::Schema;
use super::{Inner, LONG_HOLD_SECS, PgStore, Statements};
use crate::error::StoreError;
use crate::event::Limits;
use crate::nudge::Nudge;

/// Whether a row holds back its key: parked, or backing off. `h` is the row's alias; the
/// first two conditions repeat the held partial index's predicate so the planner uses it.
const HOLDS: &str = "h.dispatched_at IS NULL AND (h.next_attempt_at IS NOT NULL OR h.parked_at IS NOT NULL) \
                     AND (h.parked_at IS NOT NULL OR h.next_attempt_at > now())";

impl PgStore {
    /// The outbox in `schema`, on `pool`; reads the bucket count that
    /// [`migrate`](crate::migrate) stored.
    ///
    /// # Errors
    ///
    /// [`StoreError::NotMigrated`] when the tables are missing or older than this crate,
    /// [`StoreError::NewerSchema`] when they are newer, or the database's error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads the meta table.
    pub async fn connect(pool: PgPool, schema: Schema) -> Result<Self, StoreError> {
        let meta = schema.meta_table();
        let stored: Option<(i32, i32)> = match sqlx::query_as(AssertSqlSafe(format!(
            "SELECT version, buckets FROM {meta}"
        )))
        .fetch_optional(&pool)
        .await
        {
            Ok(stored) => stored,
            // 42P01 undefined_table, 3F000 invalid_schema_name.
            Err(sqlx::Error::Database(error))
                if matches!(error.code().as_deref(), Some("42P01" | "3F000")) =>
            {
                return Err(StoreError::NotMigrated(format!(
                    "{meta} does not exist: call taskweave_outbox::migrate first"
                )));
            }
            Err(error) => return Err(error.into()),
        };
        let Some((version, buckets)) = stored else {
            return Err(StoreError::NotMigrated(format!("{meta} is empty")));
        };
        if version > LATEST_VERSION {
            return Err(StoreError::NewerSchema {
                found: version,
                known: LATEST_VERSION,
            });
        }
        if version < LATEST_VERSION {
            return Err(StoreError::NotMigrated(format!(
                "version {version}, this crate needs {LATEST_VERSION}: call taskweave_outbox::migrate"
            )));
        }
        let buckets = u32::try_from(buckets)
            .map_err(|_| StoreError::Corrupt(format!("bucket count {buckets} in {meta}")))?;
        let events = schema.events_table();
        let bucket_table = schema.buckets_table();
        // An earlier row of `o`'s key waits (behind a failed one): `o` waits too. Read on the
        // small waiting partial index.
        let behind_waiting = format!(
            "SELECT 1 FROM {events} w WHERE w.bucket = o.bucket AND w.key = o.key AND w.id < o.id \
             AND w.dispatched_at IS NULL AND w.waiting"
        );
        // The distinct keys with waiting rows, one index descent each (a loose scan of the
        // waiting index), that have no failed row left: their waiting rows may go.
        let free_keys = format!(
            "WITH RECURSIVE k AS (
                 (SELECT w.bucket, w.key FROM {events} w
                  WHERE w.dispatched_at IS NULL AND w.waiting ORDER BY w.bucket, w.key LIMIT 1)
                 UNION ALL
                 SELECT n.bucket, n.key FROM k CROSS JOIN LATERAL (
                     SELECT w.bucket, w.key FROM {events} w
                     WHERE w.dispatched_at IS NULL AND w.waiting AND (w.bucket, w.key) > (k.bucket, k.key)
                     ORDER BY w.bucket, w.key LIMIT 1
                 ) n
             ),
             free AS (
                 SELECT k.bucket, k.key FROM k
                 WHERE NOT EXISTS (SELECT 1 FROM {events} h
                                   WHERE h.bucket = k.bucket AND h.key = k.key AND h.dispatched_at IS NULL
                                     AND (h.next_attempt_at IS NOT NULL OR h.parked_at IS NOT NULL))
             )"
        );
        let sql = Statements {
            // The key locks and the insert are one statement, so that they are one
            // transaction even on a connection in autocommit (two statements there would
            // release the lock before inserting). `locked` is an aggregate over the locks,
            // so no row reaches the insert, and no id is drawn, before every lock is held;
            // the lock calls are volatile, so the planner keeps them.
            // `notified` sends the cross-process wake-up (delivered at commit) when `$9`
            // names a channel; an aggregate, so it is one row either way.
            insert: format!(
                "WITH locked AS MATERIALIZED (
                     SELECT count(*) AS locks FROM (SELECT pg_advisory_xact_lock(l) FROM unnest($8::int8[]) AS l) s
                 ),
                 notified AS MATERIALIZED (
                     SELECT count(*) AS sent FROM (SELECT pg_notify($9::text, '') WHERE $9::text IS NOT NULL) n
                 )
                 INSERT INTO {events} (event_id, bucket, topic, key, payload, headers, seq)
                 SELECT e, b, t, k, p, h, s
                 FROM locked, notified,
                      unnest($1::uuid[], $2::int4[], $3::text[], $4::bytea[], $5::bytea[], $6::bytea[], $7::int8[])
                      WITH ORDINALITY AS x(e, b, t, k, p, h, s, n)
                 ORDER BY x.n"
            )
            .into(),
            // The buckets whose oldest claimable event is oldest, skipping those another
            // batch holds. `first` reads the pending partial index of each bucket up to its
            // first claimable entry: one entry, unless held keys come first (see `HOLDS`).
            claim_buckets: format!(
                "SELECT b.bucket
                 FROM {bucket_table} b
                 CROSS JOIN LATERAL (
                     SELECT o.id FROM {events} o
                     WHERE o.bucket = b.bucket AND o.dispatched_at IS NULL AND NOT o.waiting
                       AND NOT EXISTS (SELECT 1 FROM {events} h
                                       WHERE h.bucket = o.bucket AND h.key = o.key AND h.id <= o.id AND {HOLDS})
                       AND NOT EXISTS ({behind_waiting})
                     ORDER BY o.id LIMIT 1
                 ) first
                 ORDER BY first.id
                 LIMIT $1
                 FOR UPDATE OF b SKIP LOCKED"
            )
            .into(),
            // A separate statement from the bucket claim on purpose: under READ COMMITTED
            // each statement takes a new snapshot, and this one is taken after the bucket
            // locks are held, so it sees every commit of the batch that held a bucket
            // before. In one statement the rows would be read with a snapshot older than
            // the lock, and a bucket freed in between would be read as still pending
            // (events published twice). The per-bucket LATERAL keeps the plan on the
            // pending partial index (see the plan test); the flat `bucket = ANY(..) ORDER
            // BY id LIMIT n` walks the primary key over every dispatched row. A key held
            // back (parked, or backing off) is skipped from its held row on, through the
            // small held partial index; its bucket-mates stay claimable.
            claim_events: format!(
                "SELECT r.id, r.event_id, r.bucket, r.topic, r.key, r.payload, r.headers, r.seq, r.attempts
                 FROM unnest($1::int4[]) AS c(bucket)
                 CROSS JOIN LATERAL (
                     SELECT o.id, o.event_id, o.bucket, o.topic, o.key, o.payload, o.headers,
                            coalesce(o.seq, o.id) AS seq, o.attempts
                     FROM {events} o
                     WHERE o.bucket = c.bucket AND o.dispatched_at IS NULL AND NOT o.waiting
                       AND NOT EXISTS (SELECT 1 FROM {events} h
                                       WHERE h.bucket = o.bucket AND h.key = o.key AND h.id <= o.id AND {HOLDS})
                       AND NOT EXISTS ({behind_waiting})
                     ORDER BY o.id LIMIT $2
                 ) r
                 ORDER BY r.id
                 LIMIT $2"
            )
            .into(),
            mark: format!(
                "UPDATE {events} SET dispatched_at = now() WHERE id = ANY($1::int8[]) AND dispatched_at IS NULL"
            )
            .into(),
            // One attempt more for each failed row; backing off (`$4` milliseconds) or
            // parked (`$3`). `clock_timestamp`: the delay counts from the commit, not from
            // the claim.
            record_failures: format!(
                "UPDATE {events} o
                 SET attempts = o.attempts + 1,
                     last_error = f.error,
                     next_attempt_at = CASE WHEN f.park THEN NULL
                                            ELSE clock_timestamp() + f.delay_ms * interval '1 millisecond' END,
                     parked_at = CASE WHEN f.park THEN clock_timestamp() END
                 FROM unnest($1::int8[], $2::text[], $3::bool[], $4::int8[]) AS f(id, error, park, delay_ms)
                 WHERE o.id = f.id AND o.dispatched_at IS NULL"
            )
            .into(),
            // In the batch's transaction: the batch's own events behind each newly failed one
            // wait (bounded by the batch: `$2` is its ids).
            mark_waiting_in_batch: format!(
                "UPDATE {events} w SET waiting = true
                 FROM {events} h
                 WHERE h.id = ANY($1::int8[]) AND w.id = ANY($2::int8[])
                   AND w.bucket = h.bucket AND w.key = h.key AND w.id > h.id
                   AND w.dispatched_at IS NULL AND NOT w.waiting"
            )
            .into(),
            // After the commit, best effort and bounded (a server-side timeout, `$2` rows):
            // the rest of each failed key's ready backlog waits too. Found on the ready index
            // after the failed row (its bucket's backlog); a timeout leaves rows ready, which
            // the claim's probes still skip.
            mark_waiting: mark_behind(&events, "h.id = ANY($1::int8[])", 2).into(),
            // Writers do not mark (a probe per insert cost a third of the commit rate): the
            // relays mark, every second, the ready rows written since behind each failed row
            // held long. Found on the ready index after it; bounded like the rest.
            mark_long_held: mark_behind(
                &events,
                &format!(
                    "h.dispatched_at IS NULL AND (h.next_attempt_at IS NOT NULL OR h.parked_at IS NOT NULL)
                     AND (h.parked_at IS NOT NULL OR h.next_attempt_at > now() + interval '{LONG_HOLD_SECS} seconds')"
                ),
                1,
            )
            .into(),
            // Up to `$1` waiting rows in all, of keys with no failed row left, each key's
            // oldest first, back into the claim's index: bounded however many keys are
            // free, so that every call (under its statement timeout) makes progress. A row
            // released ahead of an older one of its key is still held behind it by the
            // claim's probes.
            release: format!(
                "{free_keys}
                 UPDATE {events} u SET waiting = false
                 WHERE u.id IN (
                     SELECT x.id FROM free f CROSS JOIN LATERAL (
                         SELECT w.id FROM {events} w
                         WHERE w.bucket = f.bucket AND w.key = f.key AND w.dispatched_at IS NULL AND w.waiting
                         ORDER BY w.id LIMIT $1
                     ) x
                     LIMIT $1
                 )"
            )
            .into(),
            pending: format!(
                "SELECT (SELECT count(*) FROM {events} WHERE dispatched_at IS NULL AND NOT waiting)
                      + (SELECT count(*) FROM {events} WHERE dispatched_at IS NULL AND waiting)"
            )
            .into(),
            // A ready row not held beyond the horizon (`$1` milliseconds from now), nor behind
            // a row of its key held beyond it (a failed row is ready, and its waiting rows
            // follow it); or waiting rows about to be released.
            has_pending: format!(
                "{free_keys}
                 SELECT EXISTS (
                     SELECT 1 FROM {events} o
                     WHERE o.dispatched_at IS NULL AND NOT o.waiting
                       AND NOT EXISTS (SELECT 1 FROM {events} h
                                       WHERE h.bucket = o.bucket AND h.key = o.key AND h.id <= o.id
                                         AND h.dispatched_at IS NULL
                                         AND (h.next_attempt_at IS NOT NULL OR h.parked_at IS NOT NULL)
                                         AND (h.parked_at IS NOT NULL
                                              OR h.next_attempt_at > now() + $1 * interval '1 millisecond'))
                 ) OR EXISTS (SELECT 1 FROM free)"
            )
            .into(),
            // Counts on the partial indexes, no probe per ready row: the ready rows, the failed
            // ones (held index), the waiting ones per key (waiting index, one probe per key),
            // the ready rows behind a parked one not yet marked waiting (a walk of its
            // bucket's ready rows after it), and the lag from the oldest ready row of each
            // bucket that is neither parked nor behind a parked one. The cost follows the
            // pending rows, never the dispatched ones kept.
            stats: format!(
                "WITH ready AS (
                     SELECT count(*) AS n FROM {events} WHERE dispatched_at IS NULL AND NOT waiting
                 ),
                 failed AS (
                     SELECT count(*) FILTER (WHERE h.parked_at IS NOT NULL) AS parked,
                            count(*) FILTER (WHERE h.parked_at IS NULL AND h.next_attempt_at > now()) AS backing_off
                     FROM {events} h
                     WHERE h.dispatched_at IS NULL AND (h.next_attempt_at IS NOT NULL OR h.parked_at IS NOT NULL)
                 ),
                 wk AS (
                     SELECT w.bucket, w.key, count(*) AS n FROM {events} w
                     WHERE w.dispatched_at IS NULL AND w.waiting
                     GROUP BY w.bucket, w.key
                 ),
                 wp AS (
                     SELECT coalesce(sum(x.n) FILTER (WHERE x.parked), 0)::int8 AS behind_parked,
                            coalesce(sum(x.n) FILTER (WHERE NOT x.parked), 0)::int8 AS waiting
                     FROM (SELECT wk.n, EXISTS (SELECT 1 FROM {events} h
                                                WHERE h.bucket = wk.bucket AND h.key = wk.key
                                                  AND h.dispatched_at IS NULL
                                                  AND (h.next_attempt_at IS NOT NULL OR h.parked_at IS NOT NULL)
                                                  AND h.parked_at IS NOT NULL) AS parked
                           FROM wk) x
                 ),
                 stray AS (
                     SELECT count(*) AS n FROM {events} h
                     CROSS JOIN LATERAL (
                         SELECT 1 FROM {events} w
                         WHERE w.bucket = h.bucket AND w.key = h.key AND w.id > h.id
                           AND w.dispatched_at IS NULL AND NOT w.waiting
                     ) x
                     WHERE h.dispatched_at IS NULL AND (h.next_attempt_at IS NOT NULL OR h.parked_at IS NOT NULL)
                       AND h.parked_at IS NOT NULL
                 ),
                 oldest AS (
                     SELECT min(f.created_at) AS at FROM {bucket_table} b
                     CROSS JOIN LATERAL (
                         SELECT o.created_at FROM {events} o
                         WHERE o.bucket = b.bucket AND o.dispatched_at IS NULL AND NOT o.waiting
                           AND o.parked_at IS NULL
                           AND NOT EXISTS (SELECT 1 FROM {events} h
                                           WHERE h.bucket = o.bucket AND h.key = o.key AND h.id < o.id
                                             AND h.dispatched_at IS NULL
                                             AND (h.next_attempt_at IS NOT NULL OR h.parked_at IS NOT NULL)
                                             AND h.parked_at IS NOT NULL)
                         ORDER BY o.id LIMIT 1
                     ) f
                 )
                 SELECT ready.n - failed.parked - stray.n + wp.waiting AS pending, failed.backing_off, failed.parked,
                        wp.behind_parked + stray.n AS behind_parked,
                        extract(epoch FROM clock_timestamp() - oldest.at)::float8 AS lag
                 FROM ready, failed, wp, stray, oldest"
            )
            .into(),
            parked: format!(
                "SELECT id, event_id, topic, key, attempts, last_error,
                        extract(epoch FROM created_at)::float8 AS created,
                        extract(epoch FROM parked_at)::float8 AS parked
                 FROM {events} h
                 WHERE h.dispatched_at IS NULL AND (h.next_attempt_at IS NOT NULL OR h.parked_at IS NOT NULL)
                   AND h.parked_at IS NOT NULL
                 ORDER BY id LIMIT $1"
            )
            .into(),
            retry_parked: format!(
                "UPDATE {events} h SET parked_at = NULL, next_attempt_at = NULL, attempts = 0
                 WHERE h.id = $1 AND h.dispatched_at IS NULL
                   AND (h.next_attempt_at IS NOT NULL OR h.parked_at IS NOT NULL) AND h.parked_at IS NOT NULL"
            )
            .into(),
            retry_parked_key: format!(
                "UPDATE {events} h SET parked_at = NULL, next_attempt_at = NULL, attempts = 0
                 WHERE h.bucket = $1 AND h.key = $2 AND h.dispatched_at IS NULL
                   AND (h.next_attempt_at IS NOT NULL OR h.parked_at IS NOT NULL) AND h.parked_at IS NOT NULL"
            )
            .into(),
            purge_parked: format!(
                "DELETE FROM {events} h
                 WHERE h.id = $1 AND h.dispatched_at IS NULL
                   AND (h.next_attempt_at IS NOT NULL OR h.parked_at IS NOT NULL) AND h.parked_at IS NOT NULL"
            )
            .into(),
            // Bounded, oldest dispatch first, on the dispatched partial index.
            delete_dispatched: format!(
                "DELETE FROM {events} WHERE id IN (
                     SELECT id FROM {events}
                     WHERE dispatched_at IS NOT NULL
                       AND dispatched_at < clock_timestamp() - $1 * interval '1 millisecond'
                     ORDER BY dispatched_at LIMIT $2
                 )"
            )
            .into(),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                schema,
                buckets,
                limits: Limits::default(),
                key_lock: true,
                notify: None,
                nudge: Nudge::new(),
                sql,
            }),
        })
    }
}

/// An update marking `waiting`, for each failed row `h` that `heads` selects, up to `$limit`
/// of the ready rows of its key after it, found on the ready index.
fn mark_behind(events: &str, heads: &str, limit: u8) -> String {
    format!(
        "UPDATE {events} u SET waiting = true
         WHERE u.id IN (
             SELECT w.id FROM {events} h
             CROSS JOIN LATERAL (
                 SELECT w.id FROM {events} w
                 WHERE w.bucket = h.bucket AND w.key = h.key AND w.id > h.id
                   AND w.dispatched_at IS NULL AND NOT w.waiting
                 ORDER BY w.id LIMIT ${limit}
             ) w
             WHERE {heads}
             LIMIT ${limit}
         )"
    )
}
