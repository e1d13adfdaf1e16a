//! `PgStore`: the outbox in PostgreSQL. Writers enqueue inside their own transaction;
//! relays claim key buckets with `FOR UPDATE SKIP LOCKED`.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPool, PgRow};
use sqlx::{AssertSqlSafe, Postgres, Row};
use uuid::Uuid;

use crate::bucket::{bucket_of, key_lock_id};
use crate::error::{EnqueueError, StoreError};
use crate::event::{Event, EventId, Limits, OutboxRecord};
use crate::headers;
use crate::nudge::Nudge;
use crate::retry::{FailedAttempt, NextAttempt};
use crate::store::{Batch, ClaimLimits, OutboxStats, ParkedEvent, Store};

/// The schema version this crate creates and reads.
const LATEST_VERSION: i32 = 2;

/// Whether a row holds back its key: parked, or backing off. `h` is the row's alias; the
/// first two conditions repeat the held partial index's predicate so the planner uses it.
const HOLDS: &str = "h.dispatched_at IS NULL AND (h.next_attempt_at IS NOT NULL OR h.parked_at IS NOT NULL) \
                     AND (h.parked_at IS NOT NULL OR h.next_attempt_at > now())";

/// Where the outbox tables live: a PostgreSQL schema and a table-name prefix.
///
/// The default is schema `public`, prefix `outbox_`: tables `public.outbox_events`,
/// `public.outbox_buckets` and `public.outbox_meta`.
#[derive(Clone, PartialEq, Eq)]
pub struct Schema {
    schema: String,
    prefix: String,
}

impl Schema {
    /// Tables in `schema`, with the default `outbox_` prefix.
    ///
    /// # Panics
    ///
    /// Panics unless `schema` is a plain lowercase identifier (`[a-z_][a-z0-9_]*`, at most
    /// 48 bytes): it is written into SQL, so nothing else is accepted.
    #[must_use]
    pub fn new(schema: &str) -> Self {
        assert!(
            is_identifier(schema, false),
            "Schema::new: {schema:?} is not a plain lowercase identifier ([a-z_][a-z0-9_]*, at most 48 bytes)"
        );
        Self {
            schema: schema.to_owned(),
            prefix: "outbox_".to_owned(),
        }
    }

    /// Sets the table-name prefix (it may be empty).
    ///
    /// # Panics
    ///
    /// Panics unless `prefix` is empty or `[a-z_][a-z0-9_]*`, at most 48 bytes.
    #[must_use]
    pub fn with_table_prefix(mut self, prefix: &str) -> Self {
        assert!(
            is_identifier(prefix, true),
            "Schema::with_table_prefix: {prefix:?} is not a plain lowercase identifier ([a-z_][a-z0-9_]*, at most 48 bytes)"
        );
        prefix.clone_into(&mut self.prefix);
        self
    }

    /// The schema's name.
    #[must_use]
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The events table, quoted for SQL.
    #[must_use]
    pub fn events_table(&self) -> String {
        self.table("events")
    }

    /// The buckets table, quoted for SQL.
    #[must_use]
    pub fn buckets_table(&self) -> String {
        self.table("buckets")
    }

    fn meta_table(&self) -> String {
        self.table("meta")
    }

    /// The consumer inbox's table of applied events, quoted for SQL.
    #[cfg(feature = "kafka")]
    pub(crate) fn inbox_table(&self) -> String {
        self.table("inbox")
    }

    /// The consumer inbox's table of each key's newest sequence, quoted for SQL.
    #[cfg(feature = "kafka")]
    pub(crate) fn inbox_keys_table(&self) -> String {
        self.table("inbox_keys")
    }

    #[cfg(feature = "kafka")]
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    fn table(&self, name: &str) -> String {
        format!("\"{}\".\"{}{name}\"", self.schema, self.prefix)
    }

    fn index(&self, name: &str) -> String {
        format!("\"{}{name}\"", self.prefix)
    }
}

impl Default for Schema {
    fn default() -> Self {
        Self::new("public")
    }
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Schema({}.{}*)", self.schema, self.prefix)
    }
}

fn is_identifier(name: &str, may_be_empty: bool) -> bool {
    if name.is_empty() {
        return may_be_empty;
    }
    let bytes = name.as_bytes();
    name.len() <= 48
        && (bytes[0].is_ascii_lowercase() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Creates or upgrades the outbox tables in `schema`, with `buckets` key buckets; returns
/// the schema version now in place. Idempotent, and safe to run from every instance at
/// start-up: concurrent runs wait on one advisory lock, and one transaction does all of it.
///
/// How many buckets: at least the most relays you will run at once times four, so relays
/// share the work evenly; 64 suits up to 16 relays. The count cannot change later (every
/// row stores its bucket).
///
/// # Errors
///
/// [`StoreError::BucketCountMismatch`] when the tables exist with another bucket count,
/// [`StoreError::NewerSchema`] when a newer crate migrated them, or the database's error.
///
/// # Panics
///
/// Panics if `buckets` is zero or above 65,536.
///
/// # Cancel safety
///
/// Not cancel safe: run it to completion (a dropped future closes its connection, and the
/// server rolls the migration back).
pub async fn migrate(pool: &PgPool, schema: &Schema, buckets: u32) -> Result<i32, StoreError> {
    migrate_up_to(pool, schema, buckets, LATEST_VERSION).await
}

/// [`migrate`], stopping at `target` (for upgrade tests: a database left at an older
/// version, as an older release of this crate made it).
#[doc(hidden)]
pub async fn migrate_up_to(
    pool: &PgPool,
    schema: &Schema,
    buckets: u32,
    target: i32,
) -> Result<i32, StoreError> {
    let target = target.clamp(1, LATEST_VERSION);
    assert!(
        (1..=65_536).contains(&buckets),
        "migrate: the bucket count must be between 1 and 65536"
    );
    let mut conn = Guarded::new(pool.acquire().await?);
    let meta = schema.meta_table();
    let lock = key_lock_id(&meta, b"migrate");
    sqlx::raw_sql("BEGIN").execute(conn.open()).await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(lock)
        .execute(conn.get())
        .await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE SCHEMA IF NOT EXISTS \"{s}\";
         CREATE TABLE IF NOT EXISTS {meta} (
             singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
             version integer NOT NULL,
             buckets integer NOT NULL CHECK (buckets > 0)
         );",
        s = schema.schema
    )))
    .execute(conn.get())
    .await?;
    let stored: Option<(i32, i32)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT version, buckets FROM {meta}"
    )))
    .fetch_optional(conn.get())
    .await?;
    let version = match stored {
        Some((version, stored_buckets)) => {
            let stored_buckets = u32::try_from(stored_buckets).unwrap_or(0);
            if stored_buckets != buckets {
                conn.rollback().await?;
                return Err(StoreError::BucketCountMismatch {
                    stored: stored_buckets,
                    requested: buckets,
                });
            }
            if version > LATEST_VERSION {
                conn.rollback().await?;
                return Err(StoreError::NewerSchema {
                    found: version,
                    known: LATEST_VERSION,
                });
            }
            version
        }
        None => 0,
    };
    if version < 1 {
        sqlx::raw_sql(AssertSqlSafe(version_1(schema, buckets)))
            .execute(conn.get())
            .await?;
    }
    if version < 2 && target >= 2 {
        sqlx::raw_sql(AssertSqlSafe(version_2(schema)))
            .execute(conn.get())
            .await?;
    }
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {meta} (version, buckets) VALUES ($1, $2)
         ON CONFLICT (singleton) DO UPDATE SET version = EXCLUDED.version"
    )))
    .bind(version.max(target))
    .bind(i32::try_from(buckets).expect("at most 65536"))
    .execute(conn.get())
    .await?;
    conn.commit().await?;
    Ok(version.max(target))
}

/// Version 1: the events table with its pending partial index, and the bucket table.
///
/// The partial index on `(bucket, id) WHERE dispatched_at IS NULL` holds only pending rows,
/// so the claim costs the same with ten or ten million dispatched rows kept. The events
/// table is vacuumed more eagerly than PostgreSQL's default (1 % dead rows instead of 20 %),
/// since every row is updated once and deleted later.
fn version_1(schema: &Schema, buckets: u32) -> String {
    let events = schema.events_table();
    let bucket_table = schema.buckets_table();
    let pending = schema.index("events_pending");
    format!(
        "CREATE TABLE {events} (
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             event_id uuid NOT NULL,
             bucket integer NOT NULL,
             topic text NOT NULL,
             key bytea NOT NULL,
             payload bytea NOT NULL,
             headers bytea NOT NULL,
             seq bigint,
             created_at timestamptz NOT NULL DEFAULT now(),
             dispatched_at timestamptz
         ) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.02);
         CREATE INDEX {pending} ON {events} (bucket, id) WHERE dispatched_at IS NULL;
         CREATE TABLE {bucket_table} (bucket integer PRIMARY KEY);
         INSERT INTO {bucket_table} (bucket) SELECT generate_series(0, {last});",
        last = buckets - 1
    )
}

/// Version 2: failed attempts on the row (count, next attempt, last error, parked); the
/// `waiting` flag, set on the events behind a failed event of their key, which takes them
/// out of the claim's index (`events_ready` replaces `events_pending`) into one of their
/// own, so a claim never walks a held key's backlog; a partial index on the failed rows
/// (`events_held`), and one on the dispatch time for retention.
///
/// Adding columns with constant defaults rewrites nothing (PostgreSQL 11+), but `ALTER
/// TABLE` takes an `ACCESS EXCLUSIVE` lock held to the end of the migration's transaction,
/// so on a large existing table every read and write of it waits while the indexes build.
/// To avoid that, run the five `ADD COLUMN`s yourself (instant), then build the four
/// indexes with `CREATE INDEX CONCURRENTLY` under the names below, then migrate: it finds
/// them (`IF NOT EXISTS`) and only drops the old one.
fn version_2(schema: &Schema) -> String {
    let events = schema.events_table();
    let ready = schema.index("events_ready");
    let waiting = schema.index("events_waiting");
    let held = schema.index("events_held");
    let dispatched = schema.index("events_dispatched");
    let old_pending = format!("\"{}\".{}", schema.schema, schema.index("events_pending"));
    format!(
        "ALTER TABLE {events}
             ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 0,
             ADD COLUMN IF NOT EXISTS next_attempt_at timestamptz,
             ADD COLUMN IF NOT EXISTS last_error text,
             ADD COLUMN IF NOT EXISTS parked_at timestamptz,
             ADD COLUMN IF NOT EXISTS waiting boolean NOT NULL DEFAULT false;
         CREATE INDEX IF NOT EXISTS {ready} ON {events} (bucket, id)
             WHERE dispatched_at IS NULL AND NOT waiting;
         CREATE INDEX IF NOT EXISTS {waiting} ON {events} (bucket, key, id)
             WHERE dispatched_at IS NULL AND waiting;
         DROP INDEX IF EXISTS {old_pending};
         CREATE INDEX IF NOT EXISTS {held} ON {events} (bucket, key, id)
             WHERE dispatched_at IS NULL AND (next_attempt_at IS NOT NULL OR parked_at IS NOT NULL);
         CREATE INDEX IF NOT EXISTS {dispatched} ON {events} (dispatched_at)
             WHERE dispatched_at IS NOT NULL;"
    )
}

/// The PostgreSQL outbox: [`enqueue`](Self::enqueue) in the caller's transaction, and the
/// [`Store`] a [`Relay`](crate::Relay) claims from. Cheap to clone.
///
/// # Per-key order
///
/// Relays publish each key's events in outbox-id order, so ids must grow with commit order
/// for each key. Two transactions writing the same key concurrently could otherwise commit
/// in the opposite order of their ids; `enqueue` prevents that by taking a
/// transaction-scoped advisory lock on the key (`pg_advisory_xact_lock`) before it inserts,
/// so writers of one key queue up until the first commits. Writers of different keys never
/// wait on each other. A transaction that enqueues several keys should enqueue them in one
/// [`enqueue_batch`](Self::enqueue_batch) (which locks them in a fixed order) or in a fixed
/// order of its own, or PostgreSQL may report a deadlock. Turn the lock off with
/// [`with_key_lock(false)`](Self::with_key_lock) when the application already serialises
/// writes per key (a `SELECT … FOR UPDATE` on the aggregate row, say).
///
/// # Examples
///
/// ```no_run
/// use taskweave_outbox::{Event, PgStore, Schema};
///
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// taskweave_outbox::migrate(&pool, &Schema::default(), 64).await?;
/// let outbox = PgStore::connect(pool.clone(), Schema::default()).await?;
///
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id, total) VALUES ($1, $2)")
///     .bind(42_i64)
///     .bind(1999_i64)
///     .execute(&mut *tx)
///     .await?;
/// outbox
///     .enqueue(&mut tx, Event::new("order-events", "order-42", br#"{"total":1999}"#.to_vec()))
///     .await?;
/// outbox.commit(tx).await?; // commits, then wakes the relays of this process
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    schema: Schema,
    buckets: u32,
    limits: Limits,
    key_lock: bool,
    /// The `NOTIFY` channel, when cross-process wake-ups are on.
    notify: Option<String>,
    nudge: Nudge,
    sql: Statements,
}

/// The statements, formatted once with the table names.
struct Statements {
    insert: Arc<str>,
    claim_buckets: Arc<str>,
    claim_events: Arc<str>,
    mark: Arc<str>,
    record_failures: Arc<str>,
    mark_waiting_in_batch: Arc<str>,
    mark_waiting: Arc<str>,
    mark_long_held: Arc<str>,
    release: Arc<str>,
    pending: Arc<str>,
    has_pending: Arc<str>,
    stats: Arc<str>,
    parked: Arc<str>,
    retry_parked: Arc<str>,
    retry_parked_key: Arc<str>,
    purge_parked: Arc<str>,
    delete_dispatched: Arc<str>,
}

/// Our statements are built only from validated identifiers ([`Schema`]) and integers.
fn sql(statement: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(statement))
}

impl PgStore {
    /// The outbox in `schema`, on `pool`; reads the bucket count that
    /// [`migrate`] stored.
    ///
    /// # Errors
    ///
    /// [`StoreError::NotMigrated`] when the tables are missing or older than this crate,
    /// [`StoreError::NewerSchema`] when they are newer, or the database's error.
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
            // Up to `$1` waiting rows of each key with no failed row left, oldest first,
            // back into the claim's index.
            release: format!(
                "{free_keys}
                 UPDATE {events} u SET waiting = false
                 WHERE u.id IN (
                     SELECT x.id FROM free f CROSS JOIN LATERAL (
                         SELECT w.id FROM {events} w
                         WHERE w.bucket = f.bucket AND w.key = f.key AND w.dispatched_at IS NULL AND w.waiting
                         ORDER BY w.id LIMIT $1
                     ) x
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

    /// Sets the limits `enqueue` checks.
    ///
    /// # Panics
    ///
    /// Panics if the store has been cloned already (the settings are shared).
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.settings().limits = limits;
        self
    }

    /// Whether `enqueue` takes the per-key advisory lock (default `true`); see the type's
    /// docs on per-key order before turning it off.
    ///
    /// # Panics
    ///
    /// Panics if the store has been cloned already (the settings are shared).
    #[must_use]
    pub fn with_key_lock(mut self, lock: bool) -> Self {
        self.settings().key_lock = lock;
        self
    }

    /// Cross-process wake-ups with `LISTEN`/`NOTIFY` (default off).
    ///
    /// On: every `enqueue` also sends a `NOTIFY` (delivered when its transaction commits),
    /// and every relay on this store keeps one extra connection that `LISTEN`s and wakes
    /// it, so a relay in another process starts publishing within a round trip instead of
    /// at its next poll. The poll stays the fallback: a notification lost while the
    /// listener reconnects costs at most one poll interval.
    ///
    /// The cost, and why it is off by default: PostgreSQL serialises the commits of every
    /// transaction that sent a `NOTIFY` on one global queue lock, so many concurrent
    /// writers commit more slowly (`docs/benchmarks.md` measures it). Writers in the
    /// relay's own process need none of this: [`commit`](Self::commit) nudges them.
    ///
    /// # Panics
    ///
    /// Panics if the store has been cloned already (the settings are shared).
    #[must_use]
    pub fn with_notify(mut self, on: bool) -> Self {
        let channel = on.then(|| {
            // A fixed-length identifier (a channel name is at most 63 bytes).
            let table = self.inner.schema.events_table();
            format!("taskweave_outbox_{:016x}", key_lock_id(&table, b"notify"))
        });
        self.settings().notify = channel;
        self
    }

    fn settings(&mut self) -> &mut Inner {
        Arc::get_mut(&mut self.inner).expect("PgStore: change settings before cloning the store")
    }

    /// The pool.
    #[must_use]
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// Where the tables are.
    #[must_use]
    pub fn schema(&self) -> &Schema {
        &self.inner.schema
    }

    /// The bucket count stored by [`migrate`].
    #[must_use]
    pub fn buckets(&self) -> u32 {
        self.inner.buckets
    }

    /// Writes `event` in the caller's transaction (or on a connection in autocommit, where
    /// it commits at once). It becomes visible to relays when that transaction commits;
    /// call [`commit`](Self::commit) (or [`notify_committed`](Self::notify_committed) after
    /// your own commit) so the relays of this process wake at once.
    ///
    /// # Errors
    ///
    /// [`EnqueueError::Invalid`] before anything is sent when the event breaks a
    /// [`Limits`] rule; [`EnqueueError::Store`] when the database refuses the write (the
    /// transaction is then aborted: roll it back).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the insert done or not; the transaction decides.
    /// Roll it back unless the future completed.
    pub async fn enqueue(
        &self,
        conn: &mut PgConnection,
        event: Event,
    ) -> Result<EventId, EnqueueError> {
        let ids = self.enqueue_batch(conn, vec![event]).await?;
        Ok(ids[0])
    }

    /// Writes `events` in the caller's transaction, in their order (ids grow in that
    /// order), in one round trip however many there are. Either all are written or none
    /// is.
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue); an invalid event names its index, and nothing is sent.
    ///
    /// # Cancel safety
    ///
    /// As [`enqueue`](Self::enqueue).
    pub async fn enqueue_batch(
        &self,
        conn: &mut PgConnection,
        events: Vec<Event>,
    ) -> Result<Vec<EventId>, EnqueueError> {
        for (index, event) in events.iter().enumerate() {
            self.inner
                .limits
                .check(event)
                .map_err(|reason| EnqueueError::Invalid { index, reason })?;
        }
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let table = self.inner.schema.events_table();
        // Sorted and deduplicated, so two transactions lock shared keys in one order.
        let mut locks: Vec<i64> = if self.inner.key_lock {
            events.iter().map(|e| key_lock_id(&table, &e.key)).collect()
        } else {
            Vec::new()
        };
        locks.sort_unstable();
        locks.dedup();
        let n = events.len();
        let mut ids = Vec::with_capacity(n);
        let mut event_ids = Vec::with_capacity(n);
        let mut buckets = Vec::with_capacity(n);
        let mut topics = Vec::with_capacity(n);
        let mut keys = Vec::with_capacity(n);
        let mut payloads = Vec::with_capacity(n);
        let mut header_bytes = Vec::with_capacity(n);
        let mut sequences = Vec::with_capacity(n);
        for event in events {
            let id = EventId::new();
            ids.push(id);
            event_ids.push(*id.as_uuid());
            // Below the bucket count, which `connect` read from an `integer` column.
            let bucket = i32::try_from(bucket_of(&event.key, self.inner.buckets))
                .map_err(|_| StoreError::Corrupt(format!("bucket count {}", self.inner.buckets)))?;
            buckets.push(bucket);
            header_bytes.push(headers::encode(&event.headers));
            topics.push(event.topic);
            keys.push(event.key);
            payloads.push(event.payload);
            sequences.push(event.sequence);
        }
        sqlx::query(sql(&self.inner.sql.insert))
            .bind(&event_ids)
            .bind(&buckets)
            .bind(&topics)
            .bind(&keys)
            .bind(&payloads)
            .bind(&header_bytes)
            .bind(&sequences)
            .bind(&locks)
            .bind(self.inner.notify.as_deref())
            .execute(&mut *conn)
            .await
            .map_err(StoreError::from)?;
        Ok(ids)
    }

    /// Commits `tx` and then wakes the relays of this process.
    ///
    /// # Errors
    ///
    /// The commit's error; no relay is woken then.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a commit dropped halfway may or may not have committed.
    pub async fn commit(&self, tx: sqlx::Transaction<'_, Postgres>) -> Result<(), sqlx::Error> {
        tx.commit().await?;
        self.inner.nudge.notify();
        Ok(())
    }

    /// Wakes the relays of this process: call it after committing a transaction that
    /// enqueued events, when you commit it yourself.
    pub fn notify_committed(&self) {
        self.inner.nudge.notify();
    }

    /// How many committed events are not yet dispatched (a count over the pending partial
    /// index, cheap however many dispatched rows are kept).
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn pending(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(sql(&self.inner.sql.pending))
            .fetch_one(&self.inner.pool)
            .await?)
    }

    /// The statement a relay uses to read a batch's events (for plan tests: `EXPLAIN` it
    /// with an `int4[]` of buckets and a limit).
    #[doc(hidden)]
    #[must_use]
    pub fn claim_events_sql(&self) -> &str {
        &self.inner.sql.claim_events
    }

    /// The statement of [`Store::stats`] (for plan tests).
    #[doc(hidden)]
    #[must_use]
    pub fn stats_sql(&self) -> &str {
        &self.inner.sql.stats
    }

    /// The statement of [`Store::delete_dispatched`] (for plan tests: milliseconds, limit).
    #[doc(hidden)]
    #[must_use]
    pub fn delete_dispatched_sql(&self) -> &str {
        &self.inner.sql.delete_dispatched
    }

    /// The statement a relay uses to claim buckets (for plan tests: `EXPLAIN` it with a
    /// bucket limit).
    #[doc(hidden)]
    #[must_use]
    pub fn claim_buckets_sql(&self) -> &str {
        &self.inner.sql.claim_buckets
    }
}

impl PgStore {
    /// After an operator's retry or purge: the first events waiting behind it go back to
    /// the claim at once (the relays release the rest), and the relays wake.
    async fn after_unpark(&self) -> Result<(), StoreError> {
        // The retry or purge has committed: a failed release only delays the waiting events
        // to the relays' next release, so it is logged, not returned.
        if let Err(error) = self.release_held_back(crate::store::RELEASE_STEP).await {
            tracing::warn!(%error, "outbox could not release the events waiting behind a retried or purged event; the relays will");
        }
        self.inner.nudge.notify();
        Ok(())
    }
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.inner.schema)
            .field("buckets", &self.inner.buckets)
            .field("key_lock", &self.inner.key_lock)
            .finish_non_exhaustive()
    }
}

impl Store for PgStore {
    type Batch = PgBatch;

    async fn claim(&self, limits: ClaimLimits) -> Result<PgBatch, StoreError> {
        let mut conn = Guarded::new(self.inner.pool.acquire().await?);
        // The session backstops: a relay stuck with its transaction open (a hung process)
        // is cut off by the server instead of holding its buckets and the xmin horizon.
        let hold_ms = limits
            .hold_at_most
            .as_millis()
            .clamp(1_000, u128::from(u32::MAX / 2));
        // Every statement of the batch (the commit last) fits in a fifth of the budget; the
        // whole transaction is cut off past it.
        sqlx::raw_sql(AssertSqlSafe(format!(
            "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {hold_ms}; SET LOCAL statement_timeout = {statement}",
            statement = (hold_ms / 5).max(1_000)
        )))
        .execute(conn.open())
        .await?;
        let buckets: Vec<i32> = sqlx::query_scalar(sql(&self.inner.sql.claim_buckets))
            .bind(i64::from(limits.buckets))
            .fetch_all(conn.get())
            .await?;
        if buckets.is_empty() {
            conn.rollback().await?;
            return Ok(PgBatch {
                conn,
                store: Arc::clone(&self.inner),
                records: Vec::new(),
            });
        }
        let rows: Vec<PgRow> = sqlx::query(sql(&self.inner.sql.claim_events))
            .bind(&buckets)
            .bind(i64::from(limits.events))
            .fetch_all(conn.get())
            .await?;
        // A row that cannot be read back (headers written by hand, say) holds back its key
        // only, like a failing event: it and the key's later rows stay pending, logged, and
        // every other key flows.
        let mut unreadable: HashSet<Vec<u8>> = HashSet::new();
        let mut records = Vec::with_capacity(rows.len());
        for row in &rows {
            let key: Vec<u8> = row.try_get("key")?;
            if unreadable.contains(&key) {
                continue;
            }
            match record_of(row) {
                Ok(record) => records.push(record),
                Err(error) => {
                    let id: Option<i64> = row.try_get("id").ok();
                    tracing::error!(id, %error, "unreadable outbox row: it and the later events of its key stay pending");
                    unreadable.insert(key);
                }
            }
        }
        Ok(PgBatch {
            conn,
            store: Arc::clone(&self.inner),
            records,
        })
    }

    async fn has_pending(&self, within: Duration) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(sql(&self.inner.sql.has_pending))
            .bind(millis_in_range(within))
            .fetch_one(&self.inner.pool)
            .await?)
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        // Bounded on the server too, so a count abandoned by its caller does not go on.
        let mut conn = Guarded::new(self.inner.pool.acquire().await?);
        let ms = STATS_TIMEOUT.as_millis();
        sqlx::raw_sql(AssertSqlSafe(format!(
            "BEGIN; SET LOCAL statement_timeout = {ms}"
        )))
        .execute(conn.open())
        .await?;
        let row = sqlx::query(sql(&self.inner.sql.stats))
            .fetch_one(conn.get())
            .await?;
        conn.commit().await?;
        let count = |name: &str| -> Result<u64, StoreError> {
            let n: i64 = row.try_get(name)?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let lag: Option<f64> = row.try_get("lag")?;
        Ok(OutboxStats {
            pending: count("pending")?,
            backing_off: count("backing_off")?,
            parked: count("parked")?,
            behind_parked: count("behind_parked")?,
            oldest_pending_age: lag
                .map(|secs| Duration::try_from_secs_f64(secs.max(0.0)).unwrap_or(Duration::MAX)),
        })
    }

    async fn parked(&self, limit: u32) -> Result<Vec<ParkedEvent>, StoreError> {
        let rows = sqlx::query(sql(&self.inner.sql.parked))
            .bind(i64::from(limit))
            .fetch_all(&self.inner.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let attempts: i32 = row.try_get("attempts")?;
                Ok(ParkedEvent {
                    id: row.try_get("id")?,
                    event_id: EventId::from_uuid(row.try_get("event_id")?),
                    topic: row.try_get("topic")?,
                    key: row.try_get("key")?,
                    attempts: u32::try_from(attempts).unwrap_or(0),
                    last_error: row.try_get("last_error")?,
                    created_at: system_time(row.try_get("created")?),
                    parked_at: system_time(row.try_get("parked")?),
                })
            })
            .collect()
    }

    async fn retry_parked(&self, id: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(sql(&self.inner.sql.retry_parked))
            .bind(id)
            .execute(&self.inner.pool)
            .await?;
        self.after_unpark().await?;
        Ok(done.rows_affected() > 0)
    }

    async fn retry_parked_key(&self, key: &[u8]) -> Result<u64, StoreError> {
        let bucket = i32::try_from(bucket_of(key, self.inner.buckets))
            .map_err(|_| StoreError::Corrupt(format!("bucket count {}", self.inner.buckets)))?;
        let done = sqlx::query(sql(&self.inner.sql.retry_parked_key))
            .bind(bucket)
            .bind(key)
            .execute(&self.inner.pool)
            .await?;
        self.after_unpark().await?;
        Ok(done.rows_affected())
    }

    async fn purge_parked(&self, id: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(sql(&self.inner.sql.purge_parked))
            .bind(id)
            .execute(&self.inner.pool)
            .await?;
        self.after_unpark().await?;
        Ok(done.rows_affected() > 0)
    }

    async fn release_held_back(&self, limit: u32) -> Result<u64, StoreError> {
        let mut conn = Guarded::new(self.inner.pool.acquire().await?);
        // Mark first (best effort: rows left ready are skipped by the claim's probes), then
        // release.
        if let Err(error) = bounded(
            &mut conn,
            &self.inner.sql.mark_long_held,
            MAINTENANCE_TIMEOUT,
            |query| query.bind(i64::from(limit)),
        )
        .await
        {
            tracing::debug!(%error, "outbox could not mark the events written behind a held key waiting");
            conn = Guarded::new(self.inner.pool.acquire().await?);
        }
        Ok(bounded(
            &mut conn,
            &self.inner.sql.release,
            MAINTENANCE_TIMEOUT,
            |query| query.bind(i64::from(limit)),
        )
        .await?)
    }

    async fn delete_dispatched(&self, older_than: Duration, limit: u32) -> Result<u64, StoreError> {
        let millis = millis_in_range(older_than);
        let done = sqlx::query(sql(&self.inner.sql.delete_dispatched))
            .bind(millis)
            .bind(i64::from(limit))
            .execute(&self.inner.pool)
            .await?;
        Ok(done.rows_affected())
    }

    fn nudge(&self) -> &Nudge {
        &self.inner.nudge
    }

    fn wake_ups(&self, token: CancellationToken) -> Option<BoxFuture<'static, ()>> {
        let channel = self.inner.notify.clone()?;
        let pool = self.inner.pool.clone();
        let nudge = self.inner.nudge.clone();
        Some(Box::pin(listen(pool, channel, nudge, token)))
    }
}

/// A failed event held at least this long (parked, or its next attempt this far away)
/// makes its key's later events wait out of the claim's index. A shorter hold does not: a
/// claim walks what a key gathers in a few seconds for less than marking and releasing
/// it would cost (transient failures are the common case).
const LONG_HOLD_SECS: u64 = 10;

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
         )"
    )
}

/// The server-side bound of [`Store::stats`].
const STATS_TIMEOUT: Duration = Duration::from_secs(10);

/// The server-side bound of a maintenance statement (releasing or marking waiting events).
const MAINTENANCE_TIMEOUT: Duration = Duration::from_secs(1);

type PgQuery<'q> = sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>;

/// Runs `statement` in a transaction of its own whose `statement_timeout` is `timeout`, so
/// the server stops it too (a client-side timeout alone would leave it running); returns
/// the rows it changed.
async fn bounded<'q>(
    conn: &mut Guarded,
    statement: &Arc<str>,
    timeout: Duration,
    bind: impl FnOnce(PgQuery<'q>) -> PgQuery<'q>,
) -> Result<u64, sqlx::Error> {
    let ms = timeout.as_millis().max(1);
    sqlx::raw_sql(AssertSqlSafe(format!(
        "BEGIN; SET LOCAL statement_timeout = {ms}"
    )))
    .execute(conn.open())
    .await?;
    let done = bind(sqlx::query(sql(statement)))
        .execute(conn.get())
        .await?;
    conn.commit().await?;
    Ok(done.rows_affected())
}

/// The longest error text kept on a row.
const MAX_ERROR_BYTES: usize = 4_096;

/// An error's text as PostgreSQL's `text` accepts it (no NUL) and at most
/// [`MAX_ERROR_BYTES`] long: a publisher's message may quote arbitrary bytes.
fn storable_error(error: &str) -> String {
    let mut text = error.replace('\0', "\u{fffd}");
    if text.len() > MAX_ERROR_BYTES {
        let mut end = MAX_ERROR_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// `duration` in milliseconds, at most a hundred years (PostgreSQL's intervals and
/// timestamps overflow far below `i64::MAX` milliseconds).
fn millis_in_range(duration: Duration) -> i64 {
    const CENTURY_MS: u128 = 100 * 365 * 86_400 * 1_000;
    i64::try_from(duration.as_millis().min(CENTURY_MS))
        .expect("a century in milliseconds fits an i64")
}

/// Seconds since the epoch, as the database gave them.
fn system_time(secs: f64) -> SystemTime {
    Duration::try_from_secs_f64(secs.max(0.0))
        .ok()
        .and_then(|since| SystemTime::UNIX_EPOCH.checked_add(since))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// How long the listener waits before connecting again after a failure.
const LISTEN_RETRY: Duration = Duration::from_secs(1);

/// `LISTEN`s on `channel` and nudges on every notification until `token` is cancelled.
/// Every (re)connection nudges too, since notifications sent while it was away are lost.
async fn listen(pool: PgPool, channel: String, nudge: Nudge, token: CancellationToken) {
    loop {
        let connected = token
            .run_until_cancelled(async {
                let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
                listener.listen(&channel).await?;
                nudge.notify();
                loop {
                    // `None`: the connection was lost and sqlx re-established it; what was
                    // sent in between is lost, so wake the relay to look.
                    if listener.try_recv().await?.is_none() {
                        tracing::debug!(%channel, "outbox listener reconnected");
                    }
                    nudge.notify();
                }
                #[allow(unreachable_code, reason = "the loop ends only with an error")]
                Ok::<(), sqlx::Error>(())
            })
            .await;
        match connected {
            None => return,
            Some(Err(error)) => {
                tracing::warn!(%channel, %error, "outbox listener failed; relays poll until it is back");
                if token
                    .run_until_cancelled(tokio::time::sleep(LISTEN_RETRY))
                    .await
                    .is_none()
                {
                    return;
                }
            }
            Some(Ok(())) => {}
        }
    }
}

fn record_of(row: &PgRow) -> Result<OutboxRecord, StoreError> {
    let bucket: i32 = row.try_get("bucket")?;
    let header_bytes: Vec<u8> = row.try_get("headers")?;
    let event_id: Uuid = row.try_get("event_id")?;
    Ok(OutboxRecord {
        id: row.try_get("id")?,
        event_id: EventId::from_uuid(event_id),
        bucket: u32::try_from(bucket)
            .map_err(|_| StoreError::Corrupt(format!("bucket {bucket}")))?,
        topic: row.try_get("topic")?,
        key: row.try_get("key")?,
        payload: row.try_get("payload")?,
        headers: headers::decode(&header_bytes)?,
        sequence: row.try_get("seq")?,
        attempts: u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0),
    })
}

/// A batch claimed from a [`PgStore`]: an open transaction holding its buckets' row locks.
/// Dropping it without [`commit`](Batch::commit) closes the connection, so the server
/// rolls the transaction back and frees the buckets, exactly as if the relay had crashed.
pub struct PgBatch {
    conn: Guarded,
    store: Arc<Inner>,
    records: Vec<OutboxRecord>,
}

impl Batch for PgBatch {
    fn records(&self) -> &[OutboxRecord] {
        &self.records
    }

    async fn complete(
        mut self,
        dispatched: Vec<i64>,
        failed: Vec<FailedAttempt>,
    ) -> Result<(), StoreError> {
        if !self.conn.in_transaction() {
            return Ok(());
        }
        if dispatched.is_empty() && failed.is_empty() {
            self.conn.rollback().await?;
            return Ok(());
        }
        if !dispatched.is_empty() {
            sqlx::query(sql(&self.store.sql.mark))
                .bind(&dispatched)
                .execute(self.conn.get())
                .await?;
        }
        if !failed.is_empty() {
            // Only a long hold takes the key's later events out of the claim's index.
            let long: Vec<i64> = failed
                .iter()
                .filter(|failure| match failure.next {
                    NextAttempt::Park => true,
                    NextAttempt::After(delay) => delay >= Duration::from_secs(LONG_HOLD_SECS),
                })
                .map(|failure| failure.id)
                .collect();
            let n = failed.len();
            let (mut ids, mut errors, mut park, mut delays) = (
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
            );
            for failure in failed {
                ids.push(failure.id);
                errors.push(storable_error(&failure.error));
                match failure.next {
                    NextAttempt::After(delay) => {
                        park.push(false);
                        delays.push(millis_in_range(delay));
                    }
                    NextAttempt::Park => {
                        park.push(true);
                        delays.push(0);
                    }
                }
            }
            sqlx::query(sql(&self.store.sql.record_failures))
                .bind(&ids)
                .bind(&errors)
                .bind(&park)
                .bind(&delays)
                .execute(self.conn.get())
                .await?;
            if long.is_empty() {
                self.conn.commit().await?;
                return Ok(());
            }
            let batch: Vec<i64> = self.records.iter().map(|record| record.id).collect();
            sqlx::query(sql(&self.store.sql.mark_waiting_in_batch))
                .bind(&long)
                .bind(&batch)
                .execute(self.conn.get())
                .await?;
            self.conn.commit().await?;
            // The failed keys' backlog beyond the batch, best effort, on this connection
            // now out of the transaction.
            if let Err(error) = bounded(
                &mut self.conn,
                &self.store.sql.mark_waiting,
                MAINTENANCE_TIMEOUT,
                |query| {
                    query
                        .bind(&long)
                        .bind(i64::from(crate::store::RELEASE_STEP))
                },
            )
            .await
            {
                tracing::debug!(%error, "outbox could not mark a failed key's backlog waiting; claims skip it row by row meanwhile");
            }
            return Ok(());
        }
        self.conn.commit().await?;
        Ok(())
    }
}

impl fmt::Debug for PgBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgBatch")
            .field("records", &self.records.len())
            .field("open", &self.conn.in_transaction())
            .finish()
    }
}

/// A pooled connection that never goes back to the pool inside a transaction.
///
/// sqlx 0.8 and 0.9.0 return a connection to the pool still inside a transaction when a
/// `begin` future is dropped halfway (sqlx issue 4393), and the next borrower's queries then
/// fail. We issue `BEGIN`/`COMMIT` ourselves and, if this guard is dropped while a
/// transaction may be open (a cancelled or aborted future, an error mid-way), detach the
/// connection from the pool and drop it: the socket closes and the server rolls back. This
/// relies only on documented behaviour: `PoolConnection::detach`, and PostgreSQL aborting
/// the transaction of a session that disconnects.
struct Guarded {
    conn: Option<PoolConnection<Postgres>>,
    in_transaction: bool,
}

impl Guarded {
    fn new(conn: PoolConnection<Postgres>) -> Self {
        Self {
            conn: Some(conn),
            in_transaction: false,
        }
    }

    /// The connection, marked as possibly inside a transaction from now on (call it for the
    /// statement that opens one).
    fn open(&mut self) -> &mut PgConnection {
        self.in_transaction = true;
        self.get()
    }

    fn get(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("the connection is held until the guard drops")
    }

    fn in_transaction(&self) -> bool {
        self.in_transaction
    }

    async fn commit(&mut self) -> Result<(), sqlx::Error> {
        sqlx::raw_sql("COMMIT").execute(self.get()).await?;
        self.in_transaction = false;
        Ok(())
    }

    async fn rollback(&mut self) -> Result<(), sqlx::Error> {
        sqlx::raw_sql("ROLLBACK").execute(self.get()).await?;
        self.in_transaction = false;
        Ok(())
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if self.in_transaction
            && let Some(conn) = self.conn.take()
        {
            drop(conn.detach());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_texts_are_stored_without_nul_and_bounded() {
        assert_eq!(storable_error("key \0 bytes"), "key \u{fffd} bytes");
        let long = "é".repeat(MAX_ERROR_BYTES);
        let stored = storable_error(&long);
        assert!(stored.len() <= MAX_ERROR_BYTES && stored.len() > MAX_ERROR_BYTES - 2);
        assert!(stored.chars().all(|c| c == 'é'));
        assert_eq!(millis_in_range(Duration::MAX), 100 * 365 * 86_400 * 1_000);
    }
}
