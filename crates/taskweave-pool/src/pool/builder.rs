//! `WorkerPoolBuilder`: the settings of a worker pool, and `spawn`.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use taskweave_supervise::TaskName;
use tokio_util::sync::CancellationToken;

use crate::{JobContext, WorkerPool};

/// What [`WorkerPool::submit`](crate::WorkerPool::submit) does when the queue is full.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Overflow {
    /// Wait for space (backpressure on the submitter). The default.
    #[default]
    Block,
    /// Refuse at once with [`SubmitError::Full`](crate::SubmitError::Full), handing the job
    /// back (the seed's "queue full → answer 429").
    Reject,
    /// Accept the new job and drop the oldest queued one: counted in
    /// [`PoolMetrics::dropped`](crate::PoolMetrics::dropped) and handed to the
    /// [`on_dropped`](WorkerPoolBuilder::on_dropped) callback. For "latest value wins" work.
    DropOldest,
}

/// The most workers a [`WorkerPool`] accepts: 65,536.
///
/// Each worker is a task with a block of counters of its own (128 bytes), allocated when the
/// pool starts, so a worker count near `usize::MAX` would be an allocation failure (an
/// abort), not a pool. A concurrency beyond this bound is not a pool's job: bound it with a
/// semaphore (`taskweave-semaphore`) around spawned tasks. The queue's `capacity` has no
/// such bound: the queue grows as jobs arrive, so `usize::MAX` means "unbounded".
pub const MAX_WORKERS: usize = 1 << 16;

pub(crate) type DropHook<J> = Arc<dyn Fn(u64, J) + Send + Sync>;

/// Settings for a [`WorkerPool`]; [`spawn`](Self::spawn) starts it.
///
/// # Examples
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use taskweave_pool::{Overflow, WorkerPool};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let dropped = Arc::new(Mutex::new(Vec::new()));
/// let sink = Arc::clone(&dropped);
/// let pool = WorkerPool::builder(1, 2)
///     .name("thumbnailer")
///     .overflow(Overflow::DropOldest)
///     .on_dropped(move |index, job: u32| sink.lock().unwrap().push((index, job)))
///     .spawn(CancellationToken::new(), |_context, job: u32| async move { Ok::<_, String>(job) });
/// // Nothing runs until this task yields, so the queue of two overflows on the third job.
/// for job in [10, 20, 30] {
///     pool.try_submit(job).unwrap();
/// }
/// assert_eq!(*dropped.lock().unwrap(), [(0, 10)]);
/// let report = pool.close().await;
/// assert_eq!((report.metrics.completed, report.metrics.dropped), (2, 1));
/// # }
/// ```
pub struct WorkerPoolBuilder<J> {
    pub(crate) name: TaskName,
    pub(crate) workers: usize,
    pub(crate) capacity: usize,
    pub(crate) overflow: Overflow,
    pub(crate) on_dropped: Option<DropHook<J>>,
    pub(crate) results: Option<usize>,
    pub(crate) take: usize,
}

impl<J> WorkerPoolBuilder<J> {
    pub(crate) fn new(workers: usize, capacity: usize) -> Self {
        assert!(workers > 0, "WorkerPool: workers must be greater than zero");
        assert!(
            workers <= MAX_WORKERS,
            "WorkerPool: {workers} workers is more than MAX_WORKERS ({MAX_WORKERS})"
        );
        assert!(
            capacity > 0,
            "WorkerPool: queue capacity must be greater than zero"
        );
        WorkerPoolBuilder {
            name: TaskName::from("pool"),
            workers,
            capacity,
            overflow: Overflow::default(),
            on_dropped: None,
            results: None,
            take: 1,
        }
    }

    /// Names the pool in logs and in its workers' task names (`NAME-worker-3`).
    #[must_use]
    pub fn name(mut self, name: impl Into<TaskName>) -> Self {
        self.name = name.into();
        self
    }

    /// Chooses what happens when the queue is full.
    #[must_use]
    pub fn overflow(mut self, overflow: Overflow) -> Self {
        self.overflow = overflow;
        self
    }

    /// Called with `(index, job)` for every job dropped by [`Overflow::DropOldest`] (on the
    /// submitter's task), and for the unstarted jobs that nobody can be handed any more
    /// (the last handle dropped after a cancellation, on the task that drops it last), so the
    /// caller can log or persist them. Keep it short; it must not block.
    ///
    /// A panic in it is caught, logged with the job and counted in
    /// [`PoolMetrics::cleanup_panicked`](crate::PoolMetrics::cleanup_panicked); the job
    /// still counts as dropped, and the other jobs' callbacks still run.
    #[must_use]
    pub fn on_dropped(mut self, on_dropped: impl Fn(u64, J) + Send + Sync + 'static) -> Self {
        self.on_dropped = Some(Arc::new(on_dropped));
        self
    }

    /// Enables [`WorkerPool::results`](crate::WorkerPool::results), a stream of outcomes
    /// buffered up to `capacity` (plus what the stream has taken and not yet handed out: see
    /// [`Results`](crate::Results)); when it is full, workers wait for the consumer.
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is zero.
    #[must_use]
    pub fn results(mut self, capacity: usize) -> Self {
        assert!(
            capacity > 0,
            "WorkerPool: results capacity must be greater than zero"
        );
        self.results = Some(capacity);
        self
    }

    /// Lets a worker that finds jobs queued take up to `max` of them at once, under one lock
    /// of the queue, and run them in order before it looks at the queue again. It takes its
    /// share: of `len` queued jobs and `w` workers, `len / w`, at least one and at most
    /// `max`, so a short queue still keeps every worker busy. The default is 1: every job
    /// is taken when a worker is ready to start it.
    ///
    /// The price is start order and latency: a job a worker holds waits for the jobs before
    /// it on that worker, even when another worker becomes free (with jobs of uneven
    /// length, a later job can start before an earlier one). And the queue's capacity no
    /// longer bounds every job accepted and not started: held jobs have left the queue, so
    /// up to `workers × (max − 1)` more may be accepted (`capacity + workers × (max − 1)` in
    /// all). Held jobs still count as queued in [`PoolMetrics`](crate::PoolMetrics) (not in
    /// [`WorkerPool::len`](crate::WorkerPool::len)), a deadline close hands them back like
    /// queued ones, and the drop-oldest policy drops only what is still in the queue. Worth
    /// it for many tiny jobs on a busy queue, where the lock round trip per job is a large
    /// part of the cost (see `docs/benchmarks.md`).
    ///
    /// # Panics
    ///
    /// Panics if `max` is zero.
    #[must_use]
    pub fn take_per_worker(mut self, max: usize) -> Self {
        assert!(max > 0, "WorkerPool: take_per_worker must be at least one");
        self.take = max;
        self
    }

    /// Starts the pool: spawns its workers (through `taskweave-supervise`) and returns it.
    ///
    /// `handler` is called with a [`JobContext`] (the job's index and the pool's token) and the
    /// job. The pool's token is a child of `token`: cancelling `token` stops intake and hands
    /// the queued jobs back at `close`.
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    pub fn spawn<R, E, H, Fut>(self, token: CancellationToken, handler: H) -> WorkerPool<J, R, E>
    where
        J: Send + 'static,
        R: Send + 'static,
        E: fmt::Display + Send + 'static,
        H: Fn(JobContext, J) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
    {
        WorkerPool::start(self, token, handler)
    }
}

impl<J> fmt::Debug for WorkerPoolBuilder<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerPoolBuilder")
            .field("name", &self.name)
            .field("workers", &self.workers)
            .field("capacity", &self.capacity)
            .field("overflow", &self.overflow)
            .field("on_dropped", &self.on_dropped.is_some())
            .field("results", &self.results)
            .field("take_per_worker", &self.take)
            .finish()
    }
}
