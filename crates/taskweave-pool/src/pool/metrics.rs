//! Counters of a worker pool, their snapshot, and the report `close` returns.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Cumulative counters of a [`WorkerPool`](crate::WorkerPool), plus its current gauges.
///
/// Every accepted job ends in exactly one counter, so once the pool is closed:
/// `submitted == completed + failed + panicked + dropped + handed_back` (property-tested).
/// While it runs, the jobs still `queued` or `in_flight` make up the difference. Rejected
/// submissions were never accepted and are counted apart.
///
/// Counters are read one by one, so a snapshot taken while jobs move may be off by the jobs
/// that moved during the read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolMetrics {
    /// Jobs accepted into the queue.
    pub submitted: u64,
    /// Jobs whose handler returned `Ok`.
    pub completed: u64,
    /// Jobs whose handler returned `Err`.
    pub failed: u64,
    /// Jobs whose handler panicked.
    pub panicked: u64,
    /// Submissions refused: queue full (reject policy, `try_submit`) or pool closed.
    pub rejected: u64,
    /// Queued jobs dropped to make room under [`Overflow::DropOldest`](crate::Overflow).
    pub dropped: u64,
    /// Queued jobs handed back by a close after cancellation or a deadline.
    pub handed_back: u64,
    /// Jobs waiting in the queue now.
    pub queued: u64,
    /// Handlers running now.
    pub in_flight: u64,
    /// Worker tasks alive now.
    pub workers_alive: u64,
}

/// What [`WorkerPool::close`](crate::WorkerPool::close) and
/// [`close_within`](crate::WorkerPool::close_within) leave you with.
#[non_exhaustive]
pub struct CloseReport<J> {
    /// Jobs that were accepted but never started, `(index, job)` in queue order. Empty after a
    /// plain `close()` of a pool whose token was not cancelled: those drain every job.
    pub handed_back: Vec<(u64, J)>,
    /// Handlers that were running when the deadline passed and saw their token cancelled
    /// (they still ended, and are counted by how they ended).
    pub interrupted: u64,
    /// `true` when the deadline of `close_within` passed before the queue drained.
    pub deadline_expired: bool,
    /// The pool's counters after every worker exited.
    pub metrics: PoolMetrics,
}

impl<J> fmt::Debug for CloseReport<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloseReport")
            .field("handed_back", &self.handed_back.len())
            .field("interrupted", &self.interrupted)
            .field("deadline_expired", &self.deadline_expired)
            .field("metrics", &self.metrics)
            .finish()
    }
}

// Relaxed everywhere: each counter is independent and increment-only; no other memory is
// published through them, and `PoolMetrics` documents that a snapshot is not atomic.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) submitted: AtomicU64,
    pub(crate) started: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) panicked: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) handed_back: AtomicU64,
    pub(crate) workers_alive: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, amount: u64) {
        counter.fetch_add(amount, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, queued: usize) -> PoolMetrics {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let completed = load(&self.completed);
        let failed = load(&self.failed);
        let panicked = load(&self.panicked);
        PoolMetrics {
            submitted: load(&self.submitted),
            completed,
            failed,
            panicked,
            rejected: load(&self.rejected),
            dropped: load(&self.dropped),
            handed_back: load(&self.handed_back),
            queued: queued as u64,
            in_flight: load(&self.started).saturating_sub(completed + failed + panicked),
            workers_alive: load(&self.workers_alive),
        }
    }
}
