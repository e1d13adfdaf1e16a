//! The transactional inbox: a handler's database effects and the record that its event was
//! applied commit in one transaction, so a redelivered event changes nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::{AssertSqlSafe, PgConnection, PgPool};

use super::message::{HandleError, Handler, Received};
use crate::error::StoreError;
use crate::store::{Guarded, Schema};

/// What the inbox does with a *stale* event: one whose [`sequence`](Received::sequence) is
/// not above the last one applied for its key (an older state arriving after a newer one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StalePolicy {
    /// Apply it like any other (the default: nothing is dropped unless you ask).
    #[default]
    Apply,
    /// Record it as seen and skip the handler: for handlers that write a key's latest
    /// state, where an older state must not overwrite a newer one.
    Skip,
}

/// The inbox's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboxStats {
    /// Events whose handler ran and committed.
    pub applied: u64,
    /// Redeliveries skipped: their event id was applied before.
    pub duplicates: u64,
    /// Stale events skipped by [`StalePolicy::Skip`].
    pub stale: u64,
}

/// The inbox's statements, written once (the table names are checked identifiers).
struct Statements {
    record: Arc<str>,
    newest: Arc<str>,
    contains: Arc<str>,
    purge: Arc<str>,
}

fn sql(statement: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(statement))
}

#[derive(Default)]
struct Counts {
    applied: AtomicU64,
    duplicates: AtomicU64,
    stale: AtomicU64,
}

/// A transactional inbox on PostgreSQL.
///
/// [`handler`](Self::handler) wraps your handler: for each message it begins a
/// transaction, records the message's [`EVENT_ID_HEADER`](crate::EVENT_ID_HEADER) in the
/// inbox table (one row per consumer name and event id), runs your handler on that
/// transaction, and commits both together. A redelivered event (after a crash, a
/// rebalance, a seek back) finds its id recorded and is skipped, so its effects happen
/// exactly once in the database. The handler's failure rolls everything back.
///
/// A message without an event id header cannot be told from its redelivery: it fails
/// permanently (to the dead-letter topic).
///
/// The inbox table grows by one row per event: [`purge_before`](Self::purge_before)
/// deletes rows older than any redelivery you expect (the topic's retention is a safe
/// bound).
///
/// # Examples
///
/// ```no_run
/// use taskweave_outbox::consume::{Consumer, HandleError, Inbox};
/// use taskweave_outbox::Schema;
/// use tokio_util::sync::CancellationToken;
///
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let schema = Schema::new("public");
/// Inbox::migrate(&pool, &schema).await?;
/// let inbox = Inbox::new(pool, &schema, "products");
/// let handler = inbox.handler(|tx, message| {
///     Box::pin(async move {
///         let name = std::str::from_utf8(message.payload().unwrap_or_default())
///             .map_err(HandleError::permanent)?;
///         sqlx::query("INSERT INTO products (name) VALUES ($1)")
///             .bind(name)
///             .execute(&mut *tx)
///             .await?;
///         Ok(())
///     })
/// });
/// let consumer = Consumer::new("127.0.0.1:9092", "products", ["product-events"])
///     .start(CancellationToken::new(), handler)
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Inbox {
    pool: PgPool,
    sql: Arc<Statements>,
    consumer: String,
    stale: StalePolicy,
    counts: Arc<Counts>,
}

/// The handler function an inbox runs: your effects, on the inbox's transaction.
pub trait InboxFn:
    for<'c> Fn(&'c mut PgConnection, &'c Received) -> BoxFuture<'c, Result<(), HandleError>>
    + Send
    + Sync
    + 'static
{
}

impl<F> InboxFn for F where
    F: for<'c> Fn(&'c mut PgConnection, &'c Received) -> BoxFuture<'c, Result<(), HandleError>>
        + Send
        + Sync
        + 'static
{
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("consumer", &self.consumer)
            .field("stale", &self.stale)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<F> std::fmt::Debug for InboxHandler<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxHandler")
            .field("inbox", &self.inbox)
            .finish_non_exhaustive()
    }
}

impl Inbox {
    /// Creates the inbox tables in `schema` (`<prefix>inbox`, `<prefix>inbox_keys`),
    /// idempotently.
    ///
    /// # Errors
    ///
    /// The database's.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the statements run in one transaction, so a dropped call leaves the
    /// tables created whole or not at all (a connection dropped inside its transaction,
    /// even while `BEGIN` or `COMMIT` is in flight, is closed rather than returned to the
    /// pool, and the server rolls the transaction back); the migration is idempotent, so
    /// run it again.
    pub async fn migrate(pool: &PgPool, schema: &Schema) -> Result<(), StoreError> {
        let (table, keys) = (schema.inbox_table(), schema.inbox_keys_table());
        let statements = [
            format!("CREATE SCHEMA IF NOT EXISTS \"{}\"", schema.schema()),
            format!(
                "CREATE TABLE IF NOT EXISTS {table} (
                    consumer text NOT NULL,
                    event_id text NOT NULL,
                    topic text NOT NULL,
                    \"partition\" integer NOT NULL,
                    \"offset\" bigint NOT NULL,
                    applied_at timestamptz NOT NULL DEFAULT now(),
                    PRIMARY KEY (consumer, event_id))"
            ),
            format!(
                "CREATE INDEX IF NOT EXISTS \"{}inbox_applied\" ON {table} (applied_at)",
                schema.prefix()
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {keys} (
                    consumer text NOT NULL,
                    topic text NOT NULL,
                    key bytea NOT NULL,
                    last_sequence bigint NOT NULL,
                    PRIMARY KEY (consumer, topic, key))"
            ),
        ];
        let mut conn = Guarded::begin(pool).await?;
        // Two services migrating at once must not race on CREATE ... IF NOT EXISTS.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(&table)
            .execute(conn.get())
            .await?;
        for statement in statements {
            sqlx::query(AssertSqlSafe(statement))
                .execute(conn.get())
                .await?;
        }
        conn.commit().await?;
        Ok(())
    }

    /// An inbox on `pool` for the consumer named `consumer` (each consumer of the same
    /// events keeps its own record: use the consumer group's name).
    #[must_use]
    pub fn new(pool: PgPool, schema: &Schema, consumer: impl Into<String>) -> Self {
        let (table, keys) = (schema.inbox_table(), schema.inbox_keys_table());
        let statements = Statements {
            record: format!(
                "INSERT INTO {table} (consumer, event_id, topic, \"partition\", \"offset\")
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING"
            )
            .into(),
            // The key's newest sequence; no row changes when this one is not newer.
            newest: format!(
                "INSERT INTO {keys} AS k (consumer, topic, key, last_sequence) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (consumer, topic, key) DO UPDATE SET last_sequence = EXCLUDED.last_sequence
                 WHERE k.last_sequence < EXCLUDED.last_sequence"
            )
            .into(),
            contains: format!(
                "SELECT EXISTS (SELECT 1 FROM {table} WHERE consumer = $1 AND event_id = $2)"
            )
            .into(),
            purge: format!(
                "DELETE FROM {table} WHERE ctid IN (SELECT ctid FROM {table}
                     WHERE consumer = $1 AND applied_at < now() - make_interval(secs => $2)
                     LIMIT $3)"
            )
            .into(),
        };
        Self {
            pool,
            sql: Arc::new(statements),
            consumer: consumer.into(),
            stale: StalePolicy::Apply,
            counts: Arc::default(),
        }
    }

    /// What to do with stale events (default [`StalePolicy::Apply`]).
    #[must_use]
    pub fn with_stale_policy(mut self, policy: StalePolicy) -> Self {
        self.stale = policy;
        self
    }

    /// The counts so far (shared by clones and by the handlers made from them).
    #[must_use]
    pub fn stats(&self) -> InboxStats {
        InboxStats {
            applied: self.counts.applied.load(Ordering::Relaxed),
            duplicates: self.counts.duplicates.load(Ordering::Relaxed),
            stale: self.counts.stale.load(Ordering::Relaxed),
        }
    }

    /// Whether this consumer has applied (or skipped as stale) event `event_id`.
    ///
    /// # Errors
    ///
    /// The database's.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: one read, no effect.
    pub async fn contains(&self, event_id: &str) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(sql(&self.sql.contains))
            .bind(&self.consumer)
            .bind(event_id)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Deletes up to `limit` of this consumer's inbox rows older than `age`; returns how
    /// many. An event redelivered after its row was purged is applied again.
    ///
    /// # Errors
    ///
    /// The database's.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: one statement; dropped, it deletes all or nothing.
    pub async fn purge_before(&self, age: Duration, limit: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(sql(&self.sql.purge))
            .bind(&self.consumer)
            .bind(age.as_secs_f64())
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Wraps `apply` into a [`Handler`] that runs it inside the inbox's transaction (see
    /// the type's docs). `apply` gets the transaction's connection and the message.
    #[must_use]
    pub fn handler<F: InboxFn>(self, apply: F) -> InboxHandler<F> {
        InboxHandler {
            inbox: self,
            apply: Arc::new(apply),
        }
    }

    async fn run<F: InboxFn>(&self, apply: &F, message: Received) -> Result<(), HandleError> {
        let Some(event_id) = message.event_id() else {
            return Err(HandleError::permanent(
                "no event_id header: the inbox cannot tell this message from a redelivery",
            ));
        };
        // A handler future dropped anywhere in here (a deadline, an abort) never returns its
        // connection to the pool inside a transaction (`Guarded`).
        let mut conn = Guarded::begin(&self.pool).await?;
        let recorded = sqlx::query(sql(&self.sql.record))
            .bind(&self.consumer)
            .bind(event_id)
            .bind(message.topic())
            .bind(message.partition())
            .bind(message.offset())
            .execute(conn.get())
            .await?
            .rows_affected();
        if recorded == 0 {
            conn.rollback().await?;
            self.counts.duplicates.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if let (Some(key), Some(sequence)) = (message.key(), message.sequence()) {
            let newer = sqlx::query(sql(&self.sql.newest))
                .bind(&self.consumer)
                .bind(message.topic())
                .bind(key)
                .bind(sequence)
                .execute(conn.get())
                .await?
                .rows_affected();
            if newer == 0 && self.stale == StalePolicy::Skip {
                conn.commit().await?;
                self.counts.stale.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
        }
        match apply(conn.get(), &message).await {
            Ok(()) => {
                // A handler that swallowed a database error leaves the transaction aborted,
                // and PostgreSQL answers the COMMIT of an aborted transaction with a
                // rollback, not an error: the event would count as applied with nothing
                // written. A statement fails in an aborted transaction, so probe first.
                if let Err(error) = sqlx::query("SELECT 1").execute(conn.get()).await {
                    let _ = conn.rollback().await;
                    return Err(HandleError::retriable(format!(
                        "the handler's transaction was aborted by an error it did not return: {error}"
                    )));
                }
                conn.commit().await?;
                self.counts.applied.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(error) => {
                // The handler's error is the one that counts; a failed rollback closes the
                // connection, which rolls back too.
                let _ = conn.rollback().await;
                Err(error)
            }
        }
    }
}

/// The [`Handler`] an [`Inbox`] makes of your function.
pub struct InboxHandler<F> {
    inbox: Inbox,
    apply: Arc<F>,
}

impl<F: InboxFn> Handler for InboxHandler<F> {
    fn handle(
        &self,
        message: Received,
    ) -> impl std::future::Future<Output = Result<(), HandleError>> + Send {
        self.inbox.run(&*self.apply, message)
    }
}
