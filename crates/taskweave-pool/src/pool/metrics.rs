//! Counters of a worker pool, their snapshot, and the report `close` returns.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Cumulative counters of a [`WorkerPool`](crate::WorkerPool), plus its current gauges.
///
/// Every accepted job ends in exactly one counter, so once the pool is closed:
/// `submitted == completed + failed + panicked + dropped + handed_back + abandoned`
/// (property-tested; `abandoned` is zero unless the pool's runtime shut down under it).
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
    /// Queued jobs handed back by a close after cancellation or a deadline (or after the
    /// worker tasks were dropped, their runtime shut down).
    pub handed_back: u64,
    /// Jobs whose handler was running when its worker task was dropped (its runtime shut
    /// down): they never finished, and nothing more is known of them. `in_flight` does not
    /// count them.
    pub abandoned: u64,
    /// Panics of user code that ran on a worker or in a drop callback outside a handler:
    /// dropping a job's output or error, an error's `Display` in the log, the `on_dropped`
    /// callback, dropping a job that never ran. Each is caught and logged with its job, and
    /// the job keeps the outcome it was counted with: this is not a job counter, and the
    /// worker keeps serving.
    pub cleanup_panicked: u64,
    /// Jobs accepted and not started: waiting in the queue, taken out of it by a worker that
    /// runs them next (see
    /// [`take_per_worker`](crate::WorkerPoolBuilder::take_per_worker); none with the
    /// default), or taken by a worker after the token was cancelled and waiting to be handed
    /// back by `close`.
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
    /// Jobs that were accepted but never started, `(index, job)` sorted by index. Empty after a
    /// plain `close()` of a pool whose token was not cancelled and whose workers are alive
    /// (not dropped with a runtime that shut down): those drain every job.
    pub handed_back: Vec<(u64, J)>,
    /// Handlers that were running when the pool's token was cancelled (by the deadline or the
    /// parent) and returned after it; they are also counted by how they ended.
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

// Relaxed everywhere: each counter is independent and only grows; no other memory is
// published through them, and `PoolMetrics` documents that a snapshot is not atomic.
//
// The per-job counters are kept per worker and written by that worker alone with a plain
// store, not a read-modify-write: a job then costs no locked instruction for its accounting.
// Acceptance is counted without a counter of its own: every submission takes an index, and
// `submitted` is the indices taken minus the submissions refused (the rare path).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) next_index: AtomicU64,
    /// Submissions not accepted: full, closed or cancelled.
    pub(crate) refused: AtomicU64,
    /// Submissions not accepted because the queue was full or the pool closed.
    pub(crate) rejected: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) handed_back: AtomicU64,
    pub(crate) cleanup_panicked: AtomicU64,
    pub(crate) workers_alive: AtomicU64,
    pub(crate) workers: Box<[WorkerCounters]>,
}

/// The counters one worker writes. Aligned to two cache lines so that workers on different
/// cores never write to the same line.
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct WorkerCounters {
    started: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    panicked: AtomicU64,
    interrupted: AtomicU64,
    /// 0 or 1: the handler this worker was running when its task was dropped.
    abandoned: AtomicU64,
    /// Jobs this worker took out of the queue and has not started (a gauge).
    held: AtomicU64,
}

impl WorkerCounters {
    /// The worker holds `jobs` jobs it took and has not started.
    pub(crate) fn hold(&self, jobs: usize) {
        self.held.store(jobs as u64, Ordering::Release);
    }

    /// Called by the worker's exit steps: a job it started and never finished was
    /// abandoned. Only the worker writes its counters, and its exit steps run after its last
    /// poll, so the plain loads see its own stores.
    pub(crate) fn abandon_running(&self) {
        let started = self.started.load(Ordering::Acquire);
        let finished = self.completed.load(Ordering::Acquire)
            + self.failed.load(Ordering::Acquire)
            + self.panicked.load(Ordering::Acquire);
        if started > finished {
            self.abandoned.store(started - finished, Ordering::Release);
        }
    }
}

/// A worker's own copy of its counters; `publish_*` store the new totals.
#[derive(Default)]
pub(crate) struct LocalCounts {
    started: u64,
    completed: u64,
    failed: u64,
    panicked: u64,
    interrupted: u64,
}

// Release stores, Acquire loads in `snapshot`: a reader that sees a job finished also sees it
// started (the worker stores `started` first). On x86 both are plain moves.
impl LocalCounts {
    pub(crate) fn started(&mut self, shared: &WorkerCounters) {
        self.started += 1;
        shared.started.store(self.started, Ordering::Release);
    }

    pub(crate) fn completed(&mut self, shared: &WorkerCounters) {
        self.completed += 1;
        shared.completed.store(self.completed, Ordering::Release);
    }

    pub(crate) fn failed(&mut self, shared: &WorkerCounters) {
        self.failed += 1;
        shared.failed.store(self.failed, Ordering::Release);
    }

    pub(crate) fn panicked(&mut self, shared: &WorkerCounters) {
        self.panicked += 1;
        shared.panicked.store(self.panicked, Ordering::Release);
    }

    pub(crate) fn interrupted(&mut self, shared: &WorkerCounters) {
        self.interrupted += 1;
        shared
            .interrupted
            .store(self.interrupted, Ordering::Release);
    }
}

impl Counters {
    pub(crate) fn new(workers: usize) -> Self {
        Counters {
            workers: (0..workers).map(|_| WorkerCounters::default()).collect(),
            ..Counters::default()
        }
    }

    pub(crate) fn add(counter: &AtomicU64, amount: u64) {
        counter.fetch_add(amount, Ordering::Relaxed);
    }

    /// Handlers that returned after the pool's token was cancelled.
    pub(crate) fn interrupted(&self) -> u64 {
        self.workers
            .iter()
            .map(|worker| worker.interrupted.load(Ordering::Acquire))
            .sum()
    }

    pub(crate) fn snapshot(&self, queued: usize) -> PoolMetrics {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let acquire = |counter: &AtomicU64| counter.load(Ordering::Acquire);
        let (mut started, mut completed, mut failed, mut panicked, mut abandoned) = (0, 0, 0, 0, 0);
        let mut held = 0;
        for worker in &self.workers {
            // Finished counts first (Acquire), then started: a job never looks finished but
            // not started.
            completed += acquire(&worker.completed);
            failed += acquire(&worker.failed);
            panicked += acquire(&worker.panicked);
            abandoned += acquire(&worker.abandoned);
            started += acquire(&worker.started);
            held += acquire(&worker.held);
        }
        PoolMetrics {
            submitted: load(&self.next_index).saturating_sub(load(&self.refused)),
            completed,
            failed,
            panicked,
            rejected: load(&self.rejected),
            dropped: load(&self.dropped),
            handed_back: load(&self.handed_back),
            abandoned,
            cleanup_panicked: load(&self.cleanup_panicked),
            queued: queued as u64 + held,
            in_flight: started.saturating_sub(completed + failed + panicked + abandoned),
            workers_alive: load(&self.workers_alive),
        }
    }
}
