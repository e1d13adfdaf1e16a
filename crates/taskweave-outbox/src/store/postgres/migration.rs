//! Creating and upgrading the outbox tables: [`migrate`], one transaction under one
//! advisory lock, version by version.

use sqlx::AssertSqlSafe;
use sqlx::postgres::PgPool;

use super::connection::Guarded;
use super::schema::Schema;
use crate::bucket::key_lock_id;
use crate::error::StoreError;

/// The schema version this crate creates and reads.
pub(super) const LATEST_VERSION: i32 = 2;

/// Creates or upgrades the outbox tables in `schema`, with `buckets` key buckets; returns
/// the schema version now in place. Idempotent, and safe to run from every instance at
/// start-up: concurrent runs wait on one advisory lock, and one transaction does all of it.
///
/// How many buckets: at least the most relays you will run at once times the buckets one
/// batch claims (`Relay::with_buckets_per_batch`, 16 by default), so that every relay finds
/// buckets free: 64 suits up to four relays with the defaults, 256 up to sixteen (or 64 with
/// `with_buckets_per_batch(4)`). The count cannot change later (every row stores its
/// bucket).
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
    let meta = schema.meta_table();
    let lock = key_lock_id(&meta, b"migrate");
    let mut conn = Guarded::begin(pool).await?;
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
