//! The [`Store`] a relay claims from, on PostgreSQL: claims, counts, the parked-event
//! operations, retention and the cross-process wake-ups.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Row};
use tokio_util::sync::CancellationToken;

use super::batch::PgBatch;
use super::connection::{Guarded, bounded};
use super::listener::listen;
use super::rows::{millis_in_range, record_of, system_time};
use super::{MAINTENANCE_TIMEOUT, PgStore, sql};
use crate::bucket::bucket_of;
use crate::error::StoreError;
use crate::event::EventId;
use crate::nudge::Nudge;
use crate::retry::{FailedAttempt, NextAttempt};
use crate::store::{ClaimLimits, OutboxStats, ParkedEvent, Store};

/// The server-side bound of [`Store::stats`].
const STATS_TIMEOUT: Duration = Duration::from_secs(10);

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
                unreadable: Vec::new(),
            });
        }
        let rows: Vec<PgRow> = sqlx::query(sql(&self.inner.sql.claim_events))
            .bind(&buckets)
            .bind(i64::from(limits.events))
            .fetch_all(conn.get())
            .await?;
        // A row that cannot be read back (headers written by hand, say) holds back its key
        // only, like a failing event: it is parked when the batch completes (so the claim's
        // held-key rules take it and the key's later rows out of the way, and an operator
        // sees it in `parked`), and every other key flows. Left pending, a key with a
        // batch's worth of rows behind it would fill every claim of its bucket.
        let mut unreadable_keys: HashSet<Vec<u8>> = HashSet::new();
        let mut unreadable = Vec::new();
        let mut records = Vec::with_capacity(rows.len());
        for row in &rows {
            let key: Vec<u8> = row.try_get("key")?;
            if unreadable_keys.contains(&key) {
                continue;
            }
            match record_of(row) {
                Ok(record) => records.push(record),
                Err(error) => {
                    let id: i64 = row.try_get("id")?;
                    tracing::error!(id, %error, "unreadable outbox row: parked; the later events of its key wait behind it");
                    unreadable.push(FailedAttempt {
                        id,
                        error: format!("unreadable row: {error}"),
                        next: NextAttempt::Park,
                    });
                    unreadable_keys.insert(key);
                }
            }
        }
        Ok(PgBatch {
            conn,
            store: Arc::clone(&self.inner),
            records,
            unreadable,
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
        // Release first: the keys that recovered depend on it, and a slow mark (many keys
        // held over a deep backlog) must not use up the call's time before it runs. Then
        // mark (best effort: rows left ready are skipped by the claim's probes).
        let released = bounded(
            &mut conn,
            &self.inner.sql.release,
            MAINTENANCE_TIMEOUT,
            |query| query.bind(i64::from(limit)),
        )
        .await?;
        if let Err(error) = bounded(
            &mut conn,
            &self.inner.sql.mark_long_held,
            MAINTENANCE_TIMEOUT,
            |query| query.bind(i64::from(limit)),
        )
        .await
        {
            tracing::debug!(%error, "outbox could not mark the events written behind a held key waiting");
        }
        Ok(released)
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
