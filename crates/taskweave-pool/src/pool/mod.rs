//! `WorkerPool`: a long-lived pool of workers fed through a bounded queue.

mod builder;
mod close;
mod metrics;
mod results;
mod submit;
mod submit_many;
mod worker;

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use taskweave_supervise::{PanicError, Supervisor, TaskName};
use tokio_util::sync::CancellationToken;

pub use builder::{MAX_WORKERS, Overflow, WorkerPoolBuilder};
pub use metrics::{CloseReport, PoolMetrics};
pub use results::Results;

/// Where the workers put `(index, outcome)` for the results stream.
pub(crate) type ResultsQueue<R, E> = Queue<(u64, JobResult<R, E>)>;

use crate::context::CancelState;
use crate::queue::Queue;
use crate::{JobContext, JobResult};
use builder::DropHook;
use metrics::Counters;
pub(super) use taskweave_supervise::internal::lock;

/// A fixed number of workers processing jobs from a bounded queue, for the life of a service.
///
/// **One trap first**: the optional [`Results`] stream ends only once nobody can submit any
/// more (the pool closed, or every handle dropped). Reading it to its end while holding a
/// handle that is never closed waits for ever; read it while `close` runs, or take it with
/// [`into_results`](Self::into_results), which gives the reader's handle up.
///
/// - [`submit`](Self::submit) waits for queue space (or drops the oldest job, or refuses,
///   per [`Overflow`]); [`try_submit`](Self::try_submit) never waits and hands the job back
///   when the queue is full or the pool closed.
/// - A handler that fails is counted; one that panics is caught, logged with the job's index
///   and backtrace, and counted; its worker keeps serving, so the pool never shrinks. The
///   same holds for every other piece of user code that runs on a worker: dropping a job's
///   output or error, an error's `Display`, the `on_dropped` callback, dropping a job that
///   never ran (counted in [`PoolMetrics::cleanup_panicked`]).
/// - [`close`](Self::close) is idempotent: intake stops, queued jobs finish, and it resolves
///   when every worker has exited. [`close_within`](Self::close_within) does the same until a
///   deadline, then cancels the running handlers' token and hands back every job that never
///   started. Cancelling the pool's token stops intake the same way.
/// - [`results`](Self::results) (when enabled) streams `(index, outcome)` in completion order.
/// - Nothing is lost silently: every accepted job is completed, failed, panicked, dropped (and
///   handed to the `on_dropped` callback) or handed back (see [`PoolMetrics`]); a job whose
///   handler was running when the runtime shut down under the pool is counted as
///   abandoned.
///
/// Jobs run on the pool's own worker tasks, so a submitter that awaits something else never
/// stalls them (unlike `buffer_unordered`, whose futures only progress while the stream is
/// polled). `WorkerPool` is a cheap handle: clones share the pool, and when the last clone is
/// dropped the queue closes and the workers exit after draining it (after a cancellation the
/// jobs that can no longer be handed back go to the `on_dropped` callback and are counted as
/// dropped). A handler that keeps a clone of its own pool keeps the pool alive: hold a clone
/// outside the handler and close it explicitly.
///
/// # Choosing the sizes
///
/// `workers` bounds the concurrency the downstream sees (database connections, CPU cores).
/// `capacity` bounds the jobs accepted but not started (plus those workers hold, with
/// [`take_per_worker`](WorkerPoolBuilder::take_per_worker) above 1): the latency a new job may wait is
/// about `capacity / throughput`; past that, backpressure (or a 429) is the honest answer.
///
/// # Examples
///
/// ```
/// use taskweave_pool::{TrySubmitError, WorkerPool};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let pool = WorkerPool::new(CancellationToken::new(), 2, 1, |_context, order: u32| async move {
///     Ok::<_, String>(order * 10)
/// });
/// let index = pool.try_submit(7).unwrap();
/// assert_eq!(index, 0);
/// // The queue holds one job and no worker has run yet: the caller answers 429.
/// assert!(matches!(pool.try_submit(8), Err(TrySubmitError::Full(8))));
/// let report = pool.close().await;
/// assert_eq!(report.metrics.completed, 1);
/// assert!(matches!(pool.try_submit(9), Err(TrySubmitError::Closed(9))));
/// # }
/// ```
pub struct WorkerPool<J, R, E> {
    handle: Arc<Handle<J, R, E>>,
}

/// The user-facing side: dropping the last one closes the queue.
struct Handle<J, R, E> {
    shared: Arc<Shared<J, R, E>>,
}

pub(crate) struct Shared<J, R, E> {
    pub(crate) name: TaskName,
    pub(crate) overflow: Overflow,
    /// The most jobs a worker takes out of the queue at once (`take_per_worker`).
    pub(crate) take: usize,
    /// The accepted jobs that have not started, with their indices.
    pub(crate) queue: Arc<Queue<(u64, J)>>,
    /// The results stream's queue, when it is enabled. The last worker out closes it (the
    /// stream then ends once drained); so does dropping the stream.
    pub(crate) results_queue: Option<Arc<ResultsQueue<R, E>>>,
    on_dropped: Option<DropHook<J>>,
    /// The token the pool was started with. Its cancellation (like that of the pool's own
    /// token) closes the queue, so a `submit` waiting on either registers nothing on it.
    given: CancellationToken,
    /// The pool's token (a child of the caller's) with its cheap flag; handlers see it
    /// through their `JobContext`.
    pub(crate) cancel: Arc<CancelState>,
    /// Accepted jobs taken out of the queue by a worker after the token was cancelled: they
    /// never started. Handed back by `close` with what is still queued.
    pub(crate) returned: Mutex<Vec<(u64, J)>>,
    /// Set when the last handle is dropped: nobody can collect handed-back jobs any more.
    pub(crate) detached: AtomicBool,
    pub(crate) counters: Counters,
    workers: Supervisor,
    results: Mutex<Option<Results<R, E>>>,
}

impl<J, R, E> Shared<J, R, E> {
    /// Closes the queue (idempotent); blocked submitters wake up and get their job back.
    pub(crate) fn close_queue(&self) -> bool {
        self.queue.close()
    }

    /// Hands a dropped job to `on_dropped`, or drops it. Both run user code, which may panic:
    /// the panic is caught, counted in `cleanup_panicked` and logged with the job, so that the
    /// caller's bookkeeping (and the other jobs' callbacks) go on.
    pub(crate) fn discard(&self, index: u64, job: J) {
        let hook = self.on_dropped.as_deref();
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(move || match hook {
            Some(on_dropped) => on_dropped(index, job),
            None => drop(job),
        }));
        if let Err(payload) = outcome {
            Counters::add(&self.counters.cleanup_panicked, 1);
            let panic = PanicError::from_panic(self.name.clone(), payload);
            log_cleanup_panic(&self.name, index, "dropping a job that never ran", &panic);
        }
    }
}

impl WorkerPool<(), (), ()> {
    /// Settings for a pool of `workers` workers and a queue of `capacity` jobs.
    ///
    /// # Panics
    ///
    /// Panics if `workers` or `capacity` is zero, or `workers` is above [`MAX_WORKERS`].
    #[must_use]
    pub fn builder<J>(workers: usize, capacity: usize) -> WorkerPoolBuilder<J> {
        WorkerPoolBuilder::new(workers, capacity)
    }
}

impl<J, R, E> WorkerPool<J, R, E>
where
    J: Send + 'static,
    R: Send + 'static,
    E: fmt::Display + Send + 'static,
{
    /// Starts a pool of `workers` workers and a queue of `capacity` jobs with the default
    /// settings (blocking overflow, no results stream). See [`WorkerPool::builder`] for the
    /// others.
    ///
    /// # Panics
    ///
    /// Panics if `workers` or `capacity` is zero, `workers` is above [`MAX_WORKERS`], or when
    /// called outside a tokio runtime.
    pub fn new<H, Fut>(
        token: CancellationToken,
        workers: usize,
        capacity: usize,
        handler: H,
    ) -> Self
    where
        H: Fn(JobContext, J) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
    {
        WorkerPoolBuilder::new(workers, capacity).spawn(token, handler)
    }

    pub(crate) fn start<H, Fut>(
        settings: WorkerPoolBuilder<J>,
        token: CancellationToken,
        handler: H,
    ) -> Self
    where
        H: Fn(JobContext, J) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
    {
        // Evicting sends never wait, so a drop-oldest pool keeps the default.
        let resume_at = match settings.overflow {
            Overflow::DropOldest => None,
            Overflow::Block | Overflow::Reject => settings.resume_at,
        };
        let queue = Arc::new(Queue::with_resume_at(
            settings.capacity,
            resume_at.unwrap_or(settings.capacity - 1),
        ));
        let closer = Arc::clone(&queue);
        let results_queue = settings
            .results
            .map(|capacity| Arc::new(Queue::new(capacity)));
        let results = results_queue
            .as_ref()
            .map(|queue| Results::new(Arc::clone(queue), settings.name.clone()));
        let given = token.clone();
        let token = token.child_token();
        let shared = Arc::new(Shared {
            given,
            name: settings.name,
            overflow: settings.overflow,
            take: settings.take,
            queue,
            results_queue,
            on_dropped: settings.on_dropped,
            workers: Supervisor::new(token.clone()),
            // Cancellation closes the queue: workers blocked in `recv` and submitters blocked
            // in `send` wake up at once, without each registering on the token.
            cancel: CancelState::with_hook(token, move || {
                closer.close();
            }),
            returned: Mutex::new(Vec::new()),
            detached: AtomicBool::new(false),
            counters: Counters::new(settings.workers),
            results: Mutex::new(results),
        });
        let handler = Arc::new(handler);
        Counters::add(&shared.counters.workers_alive, settings.workers as u64);
        for worker in 0..settings.workers {
            let exit = worker::WorkerExit::new(Arc::clone(&shared), worker);
            let task = worker::work(exit, Arc::clone(&handler));
            let name = format!("{}-worker-{worker}", shared.name);
            if shared.workers.spawn(name, task).is_err() {
                // Let the workers already spawned drain and exit before giving up.
                shared.close_queue();
                unreachable!("a new supervisor is open");
            }
        }
        shared.workers.close();
        tracing::debug!(pool = %shared.name, workers = settings.workers, capacity = settings.capacity, "worker pool started");
        WorkerPool {
            handle: Arc::new(Handle { shared }),
        }
    }

    /// Takes the results stream, if it was enabled with
    /// [`WorkerPoolBuilder::results`] and not taken yet.
    ///
    /// **The stream ends only when nobody can submit any more**: once the pool is closed
    /// ([`close`](Self::close), [`close_within`](Self::close_within), its token) or every
    /// handle is dropped, and the queued jobs are done. A caller that drains it while it still
    /// holds a handle it never closes waits for ever. Either drain it while `close` runs (as
    /// below), or give the handle up with the stream: [`into_results`](Self::into_results).
    ///
    /// Take it before closing (a close drops a stream nobody took), and drain it while jobs
    /// run: a full stream makes the workers wait, so a caller that awaits `close` (or submits
    /// everything) before reading more than the stream's capacity waits for ever too. After a
    /// cancellation the workers no longer wait on a full stream; outcomes that do not fit are
    /// only counted.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures::StreamExt;
    /// use taskweave_pool::WorkerPool;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let pool = WorkerPool::builder(2, 8)
    ///     .results(8)
    ///     .spawn(CancellationToken::new(), |_context, n: u64| async move {
    ///         if n == 2 { Err("odd input") } else { Ok(n * n) }
    ///     });
    /// let mut results = pool.results().unwrap();
    /// assert!(pool.results().is_none()); // taken once
    /// for n in 1..=3 {
    ///     pool.try_submit(n).unwrap();
    /// }
    /// // Drain while closing: the stream ends once the workers are gone.
    /// let (_report, mut outcomes) = tokio::join!(pool.close(), results.collect::<Vec<_>>());
    /// outcomes.sort_by_key(|(index, _)| *index);
    /// assert_eq!(outcomes[0].1.as_ref().unwrap(), &1);
    /// assert!(outcomes[1].1.is_err());
    /// assert_eq!(outcomes.len(), 3);
    /// # }
    /// ```
    #[must_use]
    pub fn results(&self) -> Option<Results<R, E>> {
        lock(&self.handle.shared.results).take()
    }

    /// Gives up this handle and takes the results stream, so that the stream ends as soon as
    /// the other handles are closed or dropped and the queued jobs are done (with no other
    /// handle, at once after those jobs). The form that cannot hang on a handle held by the
    /// reader: keep a clone for the submitter, which closes the pool (or drops its clone) when
    /// it is done.
    ///
    /// Returns `None` (and drops this handle) if the stream was not enabled or was taken.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures::StreamExt;
    /// use taskweave_pool::WorkerPool;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let pool = WorkerPool::builder(2, 4)
    ///     .results(4)
    ///     .spawn(CancellationToken::new(), |_context, n: u64| async move { Ok::<_, String>(n * n) });
    /// let submitter = pool.clone();
    /// let mut results = pool.into_results().unwrap();
    /// tokio::spawn(async move {
    ///     let token = submitter.token();
    ///     for n in 0..100 {
    ///         submitter.submit(&token, n).await.unwrap();
    ///     }
    ///     // `submitter` is dropped here: the pool drains and the stream ends.
    /// });
    /// let mut sum = 0;
    /// while let Some((_index, outcome)) = results.next().await {
    ///     sum += outcome.unwrap();
    /// }
    /// assert_eq!(sum, (0..100).map(|n| n * n).sum::<u64>());
    /// # }
    /// ```
    #[must_use]
    pub fn into_results(self) -> Option<Results<R, E>> {
        self.results()
    }
}

impl<J, R, E> WorkerPool<J, R, E> {
    /// A snapshot of the pool's counters and gauges.
    #[must_use]
    pub fn metrics(&self) -> PoolMetrics {
        let shared = &self.handle.shared;
        shared
            .counters
            .snapshot(shared.queue.len() + lock(&shared.returned).len())
    }

    /// Jobs waiting in the queue (not those a worker has taken out of it to run next: see
    /// [`WorkerPoolBuilder::take_per_worker`]; [`PoolMetrics::queued`] counts both).
    #[must_use]
    pub fn len(&self) -> usize {
        self.handle.shared.queue.len()
    }

    /// `true` when no job is waiting in the queue.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Handlers running now.
    #[must_use]
    pub fn in_flight(&self) -> u64 {
        self.metrics().in_flight
    }

    /// `true` once the pool accepts no more jobs: closed, dropped, or its token cancelled.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.handle.shared.queue.is_closed()
    }

    /// The pool's token; cancelled by a passed `close_within` deadline or by its parent.
    #[must_use]
    pub fn token(&self) -> CancellationToken {
        self.handle.shared.cancel.token().clone()
    }
}

impl<J, R, E> Clone for WorkerPool<J, R, E> {
    fn clone(&self) -> Self {
        WorkerPool {
            handle: Arc::clone(&self.handle),
        }
    }
}

impl<J, R, E> Drop for Handle<J, R, E> {
    fn drop(&mut self) {
        let shared = &self.shared;
        // The last handle is gone: nobody can submit or close any more. Closing the queue lets
        // the workers drain it and exit, so no task outlives its pool.
        shared.close_queue();
        // SeqCst, paired with the last worker's exit (see `WorkerExit`).
        shared.detached.store(true, Ordering::SeqCst);
        if shared.counters.workers_alive.load(Ordering::SeqCst) == 0 {
            shared.abandon_leftovers();
        }
        // After the books: the stream drops outcomes, whose `Drop` is user code. Taken out
        // first, so that the stream's drop does not run under this lock. A worker waiting
        // on it (a full stream nobody reads) is let go then, and being the last to exit, it
        // abandons the leftovers itself (it sees `detached`).
        let untaken = lock(&shared.results).take();
        drop(untaken);
    }
}

impl<J, R, E> fmt::Debug for WorkerPool<J, R, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerPool")
            .field("name", &self.handle.shared.name)
            .field("overflow", &self.handle.shared.overflow)
            .field("metrics", &self.metrics())
            .finish_non_exhaustive()
    }
}

/// Logs a caught panic of user code that ran for a job outside its handler.
pub(crate) fn log_cleanup_panic(pool: &str, index: u64, doing: &str, panic: &PanicError) {
    tracing::error!(
        pool = %pool,
        job = index,
        panic = %panic.message(),
        location = panic.location().unwrap_or("unknown"),
        "panic while {doing}: caught, the worker goes on"
    );
}

/// Logs a caught handler panic with the pool's name and the job's index.
pub(crate) fn log_panic(pool: &str, index: u64, panic: &PanicError) {
    tracing::error!(
        pool = %pool,
        job = index,
        panic = %panic.message(),
        location = panic.location().unwrap_or("unknown"),
        backtrace = %panic.backtrace(),
        "job panicked"
    );
}
