//! `PgStore`: the outbox in PostgreSQL. Writers enqueue inside their own transaction;
//! relays claim key buckets with `FOR UPDATE SKIP LOCKED`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sqlx::AssertSqlSafe;
use sqlx::postgres::PgPool;

use crate::bucket::key_lock_id;
use crate::error::StoreError;
use crate::event::Limits;
use crate::nudge::Nudge;

mod batch;
mod connect;
mod connection;
mod enqueue;
mod listener;
mod migration;
mod rows;
mod schema;
mod store_impl;

pub use batch::PgBatch;
#[cfg(feature = "kafka")]
pub(crate) use connection::Guarded;
pub use migration::{migrate, migrate_up_to};
pub use schema::Schema;

/// A failed event held at least this long (parked, or its next attempt this far away)
/// makes its key's later events wait out of the claim's index. A shorter hold does not: a
/// claim walks what a key gathers in a few seconds for less than marking and releasing
/// it would cost (transient failures are the common case).
const LONG_HOLD_SECS: u64 = 10;

/// The server-side bound of a maintenance statement (releasing or marking waiting events).
const MAINTENANCE_TIMEOUT: Duration = Duration::from_secs(1);

/// The PostgreSQL outbox: [`enqueue`](Self::enqueue) in the caller's transaction, and the
/// [`Store`](crate::Store) a [`Relay`](crate::Relay) claims from. Cheap to clone.
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

    /// How many committed events are not yet dispatched (a count over the pending partial
    /// index, cheap however many dispatched rows are kept).
    ///
    /// # Errors
    ///
    /// The database's error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: one read, no effect.
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

    /// The statement of [`Store::stats`](crate::Store::stats) (for plan tests).
    #[doc(hidden)]
    #[must_use]
    pub fn stats_sql(&self) -> &str {
        &self.inner.sql.stats
    }

    /// The statement of [`Store::delete_dispatched`](crate::Store::delete_dispatched) (for plan
    /// tests: milliseconds, limit).
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

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.inner.schema)
            .field("buckets", &self.inner.buckets)
            .field("key_lock", &self.inner.key_lock)
            .finish_non_exhaustive()
    }
}
