//! A claimed batch on PostgreSQL: [`PgBatch`], an open transaction holding its buckets'
//! row locks, and its completion.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::connection::{Guarded, bounded};
use super::rows::{millis_in_range, storable_error};
use super::{Inner, LONG_HOLD_SECS, MAINTENANCE_TIMEOUT, sql};
use crate::error::StoreError;
use crate::event::OutboxRecord;
use crate::retry::{FailedAttempt, NextAttempt};
use crate::store::Batch;

/// A batch claimed from a [`PgStore`](crate::PgStore): an open transaction holding its
/// buckets' row locks. Dropping it without [`commit`](Batch::commit) closes the connection,
/// so the server rolls the transaction back and frees the buckets, exactly as if the relay
/// had crashed.
pub struct PgBatch {
    pub(super) conn: Guarded,
    pub(super) store: Arc<Inner>,
    pub(super) records: Vec<OutboxRecord>,
    /// Claimed rows that could not be read back: parked with the batch's completion.
    pub(super) unreadable: Vec<FailedAttempt>,
}

impl Batch for PgBatch {
    fn records(&self) -> &[OutboxRecord] {
        &self.records
    }

    async fn complete(
        mut self,
        dispatched: Vec<i64>,
        mut failed: Vec<FailedAttempt>,
    ) -> Result<(), StoreError> {
        if !self.conn.in_transaction() {
            return Ok(());
        }
        failed.append(&mut self.unreadable);
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
