//! The relay's cumulative counters, readable while it runs.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::PublishErrorKind;
use crate::relay::BatchSummary;
use crate::store::OutboxStats;

/// Plain event counters. Each is read and written on its own (`Relaxed`): a snapshot is a
/// set of counts taken one after another, not one instant, and nothing synchronises
/// through them.
#[derive(Default)]
pub(crate) struct Counters {
    batches: AtomicU64,
    empty_polls: AtomicU64,
    dispatched: AtomicU64,
    retriable_failures: AtomicU64,
    permanent_failures: AtomicU64,
    held_back: AtomicU64,
    sent_after_failure: AtomicU64,
    store_errors: AtomicU64,
    published_not_committed: AtomicU64,
    parked: AtomicU64,
    backoffs: AtomicU64,
    claimed: AtomicU64,
    batch_micros: AtomicU64,
    last_batch_events: AtomicU64,
    last_batch_micros: AtomicU64,
    max_batch_micros: AtomicU64,
    publisher_recoveries: AtomicU64,
    /// The store's counts as last read, and when.
    store: Mutex<Option<(OutboxStats, Instant)>>,
}

impl Counters {
    pub(crate) fn empty_poll(&self) {
        self.empty_polls.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn store_error(&self) {
        self.store_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn publish_failed(&self, kind: PublishErrorKind, count: usize) {
        match kind {
            PublishErrorKind::Permanent | PublishErrorKind::Fatal => &self.permanent_failures,
            _ => &self.retriable_failures,
        }
        .fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn batch_committed(&self, summary: &BatchSummary, parked: usize, backoffs: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.dispatched
            .fetch_add(summary.dispatched as u64, Ordering::Relaxed);
        self.sent_after_failure
            .fetch_add(summary.sent_after_failure as u64, Ordering::Relaxed);
        self.held_back
            .fetch_add(summary.held_back as u64, Ordering::Relaxed);
        self.parked.fetch_add(parked as u64, Ordering::Relaxed);
        self.backoffs.fetch_add(backoffs as u64, Ordering::Relaxed);
    }

    /// Keeps `stats` as the latest counts; returns the previous ones.
    pub(crate) fn store_stats(&self, stats: OutboxStats) -> Option<OutboxStats> {
        self.store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace((stats, Instant::now()))
            .map(|(stats, _)| stats)
    }

    pub(crate) fn publisher_recovered(&self) {
        self.publisher_recoveries.fetch_add(1, Ordering::Relaxed);
    }

    /// A batch that claimed `claimed` events took `took`, claim to commit.
    pub(crate) fn batch_took(&self, claimed: usize, took: Duration) {
        if claimed == 0 {
            return;
        }
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.claimed.fetch_add(claimed as u64, Ordering::Relaxed);
        self.batch_micros.fetch_add(micros, Ordering::Relaxed);
        self.last_batch_events
            .store(claimed as u64, Ordering::Relaxed);
        self.last_batch_micros.store(micros, Ordering::Relaxed);
        self.max_batch_micros.fetch_max(micros, Ordering::Relaxed);
    }

    pub(crate) fn commit_failed(&self, published: usize) {
        self.store_errors.fetch_add(1, Ordering::Relaxed);
        self.published_not_committed
            .fetch_add(published as u64, Ordering::Relaxed);
    }
}

/// A relay's counters, readable from anywhere while it runs (see
/// [`Relay::metrics`](crate::Relay::metrics)). Cheap to clone.
#[derive(Clone)]
pub struct RelayMetricsHandle {
    counters: Arc<Counters>,
}

impl RelayMetricsHandle {
    pub(crate) fn new(counters: Arc<Counters>) -> Self {
        Self { counters }
    }

    /// The counts so far.
    #[must_use]
    pub fn snapshot(&self) -> RelayMetrics {
        let c = &self.counters;
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        RelayMetrics {
            batches: get(&c.batches),
            empty_polls: get(&c.empty_polls),
            dispatched: get(&c.dispatched),
            retriable_failures: get(&c.retriable_failures),
            permanent_failures: get(&c.permanent_failures),
            held_back: get(&c.held_back),
            sent_after_failure: get(&c.sent_after_failure),
            store_errors: get(&c.store_errors),
            published_not_committed: get(&c.published_not_committed),
            parked: get(&c.parked),
            backoffs: get(&c.backoffs),
            claimed: get(&c.claimed),
            batch_time: Duration::from_micros(get(&c.batch_micros)),
            last_batch_events: get(&c.last_batch_events),
            last_batch_took: Duration::from_micros(get(&c.last_batch_micros)),
            max_batch_took: Duration::from_micros(get(&c.max_batch_micros)),
            publisher_recoveries: get(&c.publisher_recoveries),
            store: *c.store.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }
}

impl fmt::Debug for RelayMetricsHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RelayMetricsHandle")
            .field(&self.snapshot())
            .finish()
    }
}

/// Cumulative counts of a relay, and the store's counts as it last read them
/// ([`Store::stats`](crate::Store::stats): pending, the lag, parked).
///
/// Failed attempts are counted as they happen; a batch's other counts (`batches`,
/// `dispatched`, `held_back`, `parked`, …) are added after its commit returns. So a reader
/// who sees a batch's effect in the store (fewer pending events) can take a snapshot a
/// moment before it includes that batch; a batch is counted before the relay claims the next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayMetrics {
    /// Batches that claimed events and committed.
    pub batches: u64,
    /// Claims that found nothing.
    pub empty_polls: u64,
    /// Events published and marked dispatched.
    pub dispatched: u64,
    /// Failed attempts that may work later (broker unavailable, leader changes, timeouts,
    /// acknowledgements that did not come back within the batch budget). One per key and
    /// batch: the key's later events wait and are not tried.
    pub retriable_failures: u64,
    /// Failed attempts that will not work without a change (too large, unknown topic, not
    /// authorised), or a publisher broken for good.
    pub permanent_failures: u64,
    /// Events parked: after their last attempt, or at once for a permanent error.
    pub parked: u64,
    /// Failed attempts followed by a backoff (the event is tried again later).
    pub backoffs: u64,
    /// Events not sent because an earlier event of their key failed in the same batch (or
    /// the batch ran out of time): left pending, in order.
    pub held_back: u64,
    /// Events acknowledged after an earlier event of their key had failed in the same
    /// batch. They are left pending and published again after it, so a consumer sees them
    /// twice, the first time out of order. With the idempotent Kafka producer this needs an
    /// earlier message of the partition to time out while a later one gets through.
    pub sent_after_failure: u64,
    /// Claims or commits the store refused.
    pub store_errors: u64,
    /// Events acknowledged by the broker whose batch then failed to commit: they will be
    /// published again (the duplicates consumers will see).
    pub published_not_committed: u64,
    /// Events claimed by batches (the mean batch size is `claimed / batches`).
    pub claimed: u64,
    /// The time of every batch that claimed events, claim to commit, summed.
    pub batch_time: Duration,
    /// The events the last batch that claimed any claimed.
    pub last_batch_events: u64,
    /// How long that batch took.
    pub last_batch_took: Duration,
    /// The longest batch so far.
    pub max_batch_took: Duration,
    /// Times the publisher replaced its transport after batches that delivered nothing
    /// (see [`Publisher::recover`](crate::Publisher::recover)).
    pub publisher_recoveries: u64,
    /// What waits in the store (pending, the lag, parked) as the relay last read it, and
    /// when (on tokio's clock); see [`Relay::with_stats_interval`](crate::Relay::with_stats_interval).
    pub store: Option<(OutboxStats, Instant)>,
}
