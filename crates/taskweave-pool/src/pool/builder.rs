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
    pub(crate) resume_at: Option<usize>,
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
            resume_at: None,
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
    /// [`Results`](crate::Results)); when it is full, workers wait for the consumer. So
    /// read it on a task other than the one that submits: a submitter blocked on a full
    /// queue while the stream is full waits for workers that wait for it (see
    /// [`resume_at`](Self::resume_at), which makes that likelier).
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

    /// Hysteresis for a full queue: once the queue is full, it takes no job until the workers
    /// have drained it to `queued` jobs; then the submitters waiting in
    /// [`submit`](crate::WorkerPool::submit) or
    /// [`submit_many`](crate::WorkerPool::submit_many) resume, the longest waiting first, as
    /// many as there is room for. The default, `capacity − 1`, takes a job as soon as a slot
    /// frees. Netty's write-buffer water marks work the same way.
    ///
    /// Worth it when the submitter runs on a thread outside the runtime (the future given to
    /// `block_on`, a plain thread calling `Handle::block_on`) on a machine with few cores and
    /// the jobs keep the workers busy. Every wake-up of that blocked thread is a system call,
    /// and it takes a core from a worker for a moment; with a default queue it is woken about
    /// once per few freed slots, and with `resume_at(capacity / 4)` about once per three
    /// quarters of the queue. Measured with 1 µs CPU jobs on two cores, a queue of 128, fed
    /// from `block_on`, with `resume_at(32)`: 1.24–1.34 × the time of two plain threads doing
    /// the same work in three alternating runs, 1.25–1.69 × in a noisier summary run, instead
    /// of 2.0–2.3 × without it; and 1.10–1.45 × with
    /// [`take_per_worker(32)`](Self::take_per_worker) too (`docs/benchmarks.md`, pool
    /// section). Submitters on the runtime's own tasks gain nothing (waking them is cheap):
    /// it measured slower there, 1.21–1.50 × against 1.10–1.16 ×.
    ///
    /// The price:
    ///
    /// - a blocked `submit` returns later: after `capacity − queued` jobs have left the
    ///   queue instead of one. Its job does not start later for that (the queue is FIFO:
    ///   with one submitter, the same jobs are ahead of it either way), unless the workers
    ///   empty the queue before the submitter is back;
    /// - while the queue drains, [`try_submit`](crate::WorkerPool::try_submit) and
    ///   [`Overflow::Reject`] refuse with `Full`
    ///   ([`TrySubmitError::Full`](crate::TrySubmitError::Full),
    ///   [`SubmitError::Full`](crate::SubmitError::Full)) although
    ///   [`WorkerPool::len`](crate::WorkerPool::len) is below the capacity: the
    ///   queue stays full, to new and waiting submitters alike, until it has drained, so
    ///   newcomers cannot keep a waiting submitter out by keeping the queue above `queued`
    ///   (once the waiting submitters are woken, nothing reserves the room for them, as
    ///   without `resume_at`);
    /// - too low a `queued` with short jobs lets the workers run dry while the submitter
    ///   wakes up. A quarter of the capacity, or the workers' count times
    ///   `take_per_worker` if that is larger (and below the capacity), is a good start;
    /// - **a task that submits and also reads the [`results`](Self::results) stream between
    ///   its submits can wait for ever**: blocked in `submit`, it does not read, so the
    ///   workers stop once the stream is full, while the queue still holds more than
    ///   `queued`. Without `resume_at` one job taken wakes it, although on the multi-thread
    ///   runtime the stream can fill up before it blocks there too. Read the results on
    ///   another task.
    ///
    /// With [`Overflow::DropOldest`] nothing waits and nothing is refused, so this has no
    /// effect.
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_pool::{TrySubmitError, WorkerPool};
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let pool = WorkerPool::builder(1, 4)
    ///     .resume_at(1)
    ///     .spawn(CancellationToken::new(), |_context, job: u32| async move { Ok::<_, String>(job) });
    /// for job in 0..4 {
    ///     pool.try_submit(job).unwrap();
    /// }
    /// // Full: refused until the worker has drained the queue to one job.
    /// assert!(matches!(pool.try_submit(4), Err(TrySubmitError::Full(4))));
    /// pool.submit(&CancellationToken::new(), 4).await.unwrap(); // waits for that
    /// assert!(pool.len() <= 2);
    /// let report = pool.close().await;
    /// assert_eq!(report.metrics.completed, 5);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics if `queued` is not below the queue's capacity.
    #[must_use]
    pub fn resume_at(mut self, queued: usize) -> Self {
        assert!(
            queued < self.capacity,
            "WorkerPool: resume_at({queued}) must be below the queue capacity ({})",
            self.capacity
        );
        self.resume_at = Some(queued);
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
            .field("resume_at", &self.resume_at)
            .finish()
    }
}
