//! Retention: deletes dispatched events after a configured age, in bounded batches, on a
//! [`taskweave_periodic::Periodic`] schedule.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use taskweave_periodic::{Periodic, PeriodicReport, Schedule};
use taskweave_supervise::TaskHandle;
use tokio_util::sync::CancellationToken;

use crate::error::StoreError;
use crate::store::Store;

/// Deletes dispatched events older than an age, periodically, never a pending or parked
/// one.
///
/// Each run deletes in batches of [`batch_size`](Self::with_batch_size) rows (one short
/// statement each, oldest dispatch first, on the dispatched partial index) until a batch
/// comes back short or [`max_batches_per_run`](Self::with_max_batches_per_run) is reached,
/// so no cleanup holds long locks or writes a burst of WAL, and a backlog is worked off
/// over a few runs. Cancelling the token stops it between two statements; no statement is
/// cut off.
///
/// # Table health
///
/// The migration sets the events table's `autovacuum_vacuum_scale_factor` to 0.01 (vacuum
/// after 1 % dead rows, not PostgreSQL's 20 %) and `autovacuum_analyze_scale_factor` to
/// 0.02: every event is updated once (dispatched) and deleted once (here), so dead tuples
/// come at the rate events do, and vacuum keeps up in small steps.
///
/// For very high volume (tens of millions of events a day), deleting rows at all is the
/// cost; partition instead and drop whole partitions: create the events table partitioned
/// by range of `created_at` (one partition a day, with the same columns and indexes as
/// the migration makes), point the outbox at it, and drop a partition once every event in
/// it is dispatched (`SELECT NOT EXISTS (SELECT 1 FROM part WHERE dispatched_at IS NULL)`);
/// `DROP TABLE` frees the space at once, with no dead tuples and no vacuum.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_outbox::{Event, MemoryStore, Retention, Store};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let store = MemoryStore::new(16);
/// let retention = Retention::new(store.clone(), Duration::from_secs(7 * 86_400))
///     .with_period(Duration::from_secs(600))
///     .with_batch_size(5_000);
/// // Nothing dispatched yet: nothing to delete.
/// assert_eq!(retention.run_once(&Default::default()).await.unwrap(), 0);
/// # }
/// ```
pub struct Retention<S> {
    store: S,
    older_than: Duration,
    batch_size: u32,
    max_batches: u32,
    period: Duration,
    deleted: Arc<AtomicU64>,
}

impl<S: Store + Clone> Retention<S> {
    /// Deletes events of `store` dispatched more than `older_than` ago; by default every
    /// minute, in batches of 5,000, at most 100 batches a run.
    pub fn new(store: S, older_than: Duration) -> Self {
        Self {
            store,
            older_than,
            batch_size: 5_000,
            max_batches: 100,
            period: Duration::from_secs(60),
            deleted: Arc::default(),
        }
    }

    /// Rows per delete statement.
    ///
    /// # Panics
    ///
    /// Panics if `size` is zero.
    #[must_use]
    pub fn with_batch_size(mut self, size: u32) -> Self {
        assert!(
            size > 0,
            "Retention::with_batch_size: the size must be greater than zero"
        );
        self.batch_size = size;
        self
    }

    /// The most delete statements in one run.
    ///
    /// # Panics
    ///
    /// Panics if `batches` is zero.
    #[must_use]
    pub fn with_max_batches_per_run(mut self, batches: u32) -> Self {
        assert!(
            batches > 0,
            "Retention::with_max_batches_per_run: the count must be greater than zero"
        );
        self.max_batches = batches;
        self
    }

    /// The time between two runs' starts.
    ///
    /// # Panics
    ///
    /// Panics if `period` is zero.
    #[must_use]
    pub fn with_period(mut self, period: Duration) -> Self {
        assert!(
            !period.is_zero(),
            "Retention::with_period: the period must be greater than zero"
        );
        self.period = period;
        self
    }

    /// Events deleted so far, by every run of this retention and its clones' runs.
    #[must_use]
    pub fn deleted(&self) -> u64 {
        self.deleted.load(Ordering::Relaxed)
    }

    /// One run: deletes batch after batch until one comes back short, the batch limit is
    /// reached, or `token` is cancelled (checked between statements). Returns how many it
    /// deleted.
    ///
    /// # Errors
    ///
    /// The store's failure; what earlier batches deleted stays deleted.
    ///
    /// # Cancel safety
    ///
    /// Each statement commits on its own; dropping the future may leave the statement in
    /// flight done or not, and nothing else. Cancel `token` instead to stop between two.
    pub async fn run_once(&self, token: &CancellationToken) -> Result<u64, StoreError> {
        let mut total = 0;
        for _ in 0..self.max_batches {
            if token.is_cancelled() {
                break;
            }
            let deleted = self
                .store
                .delete_dispatched(self.older_than, self.batch_size)
                .await?;
            total += deleted;
            self.deleted.fetch_add(deleted, Ordering::Relaxed);
            if deleted < u64::from(self.batch_size) {
                break;
            }
        }
        if total > 0 {
            tracing::debug!(
                deleted = total,
                "outbox retention deleted dispatched events"
            );
        }
        Ok(total)
    }

    /// Runs [`run_once`](Self::run_once) every period (fixed gap: a long run delays the
    /// next, runs never overlap) until `token` is cancelled. A failed run is logged and
    /// counted in the report; the next run tries again.
    ///
    /// # Cancel safety
    ///
    /// As [`Periodic::run`].
    pub async fn run(self, token: CancellationToken) -> PeriodicReport {
        let this = Arc::new(self);
        Periodic::new(this.period)
            .with_name("outbox retention")
            .with_schedule(Schedule::FixedGap)
            .run(token, move |run_token| {
                let this = Arc::clone(&this);
                async move { this.run_once(&run_token).await.map(drop) }
            })
            .await
    }

    /// [`run`](Self::run) on a task of its own.
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    #[track_caller]
    pub fn spawn(self, token: CancellationToken) -> TaskHandle<PeriodicReport>
    where
        S: Clone,
    {
        taskweave_supervise::spawn("outbox retention", self.run(token))
    }
}

impl<S> Clone for Retention<S>
where
    S: Clone,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            older_than: self.older_than,
            batch_size: self.batch_size,
            max_batches: self.max_batches,
            period: self.period,
            deleted: Arc::clone(&self.deleted),
        }
    }
}

impl<S> fmt::Debug for Retention<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retention")
            .field("older_than", &self.older_than)
            .field("batch_size", &self.batch_size)
            .field("max_batches_per_run", &self.max_batches)
            .field("period", &self.period)
            .field("deleted", &self.deleted.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}
