//! `WorkerPool`: a long-lived pool of workers fed through a bounded queue.

mod builder;
mod metrics;
mod results;
mod worker;

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use taskweave_supervise::{PanicError, Supervisor, TaskName};
use tokio_util::sync::CancellationToken;

pub use builder::{MAX_WORKERS, Overflow, WorkerPoolBuilder};
pub use metrics::{CloseReport, PoolMetrics};
pub use results::Results;

/// Where the workers put `(index, outcome)` for the results stream.
pub(crate) type ResultsQueue<R, E> = Queue<(u64, JobResult<R, E>)>;

use crate::context::CancelState;
use crate::queue::{Queue, TrySendError};
use crate::{JobContext, JobResult, SubmitError, TrySubmitError};
use builder::DropHook;
use metrics::Counters;

/// A fixed number of workers processing jobs from a bounded queue, for the life of a service.
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
/// `capacity` bounds the jobs accepted but not started: the latency a new job may wait is
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

    /// Takes every accepted job that never started: those set aside by workers after a
    /// cancellation and those still queued, sorted by index.
    fn take_unstarted(&self) -> Vec<(u64, J)> {
        let mut unstarted = std::mem::take(&mut *lock(&self.returned));
        unstarted.extend(self.queue.drain());
        unstarted.sort_unstable_by_key(|(index, _)| *index);
        unstarted
    }

    /// After the last handle and the last worker are gone, nobody can hand the unstarted jobs
    /// back: they are counted as dropped and passed to `on_dropped`, never silently lost.
    pub(crate) fn abandon_leftovers(&self) {
        let leftovers = self.take_unstarted();
        if leftovers.is_empty() {
            return;
        }
        Counters::add(&self.counters.dropped, leftovers.len() as u64);
        tracing::warn!(pool = %self.name, jobs = leftovers.len(), "pool dropped after cancellation without close: unstarted jobs dropped");
        for (index, job) in leftovers {
            self.discard(index, job);
        }
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
        let queue = Arc::new(Queue::new(settings.capacity));
        let closer = Arc::clone(&queue);
        let results_queue = settings
            .results
            .map(|capacity| Arc::new(Queue::new(capacity)));
        let results = results_queue
            .as_ref()
            .map(|queue| Results::new(Arc::clone(queue)));
        let given = token.clone();
        let token = token.child_token();
        let shared = Arc::new(Shared {
            given,
            name: settings.name,
            overflow: settings.overflow,
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

    /// Queues `job`, waiting for space when the queue is full and the policy is
    /// [`Overflow::Block`]. Returns the job's index, taken when the submission starts (a
    /// refused submission leaves a gap; blocked submitters are not served in index order).
    ///
    /// With [`Overflow::Reject`] a full queue refuses at once; with [`Overflow::DropOldest`]
    /// the oldest queued job makes room.
    ///
    /// # Errors
    ///
    /// The job is handed back in every case: [`SubmitError::Full`] (reject policy),
    /// [`SubmitError::Closed`] (the pool is closed or its token cancelled, also while
    /// waiting), [`SubmitError::Cancelled`] (`token` was cancelled while waiting for space).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in the sense that matters: if the future is dropped before it completes,
    /// the job was not queued (it is dropped with the future) and the submission is counted
    /// as not accepted. To keep the job on cancellation, pass the token instead:
    /// `Cancelled(job)` hands it back.
    ///
    /// # Cost of the token
    ///
    /// Waiting on the token the pool was started with (or a clone of it), or on
    /// [`token`](Self::token), costs nothing extra: their cancellation closes the queue, which
    /// ends the wait. Any other token, a child of those included, is watched beside the wait
    /// (a registration on the token for each wait that finds the queue full), and checked
    /// before anything else: a cancelled one gives `Cancelled` even with room in the queue
    /// (one lock of the token per submit). The pool's own tokens close the queue inside
    /// `cancel()`, so a submit after their cancellation gets `Closed`.
    pub async fn submit(&self, token: &CancellationToken, job: J) -> Result<u64, SubmitError<J>> {
        let shared = &self.handle.shared;
        let own = token == &shared.given || token == shared.cancel.token();
        let index = shared.counters.next_index.fetch_add(1, Ordering::Relaxed);
        // A cancellation observed before the job is taken wins, even with room in the queue.
        // The pool's own tokens need no check: their cancellation closes the queue inside
        // `cancel()`, so the queue answers `Closed` for them.
        if !own && token.is_cancelled() {
            Counters::add(&shared.counters.refused, 1);
            return Err(SubmitError::Cancelled(job));
        }
        // Counts the submission as refused if this future is dropped before it resolves (or a
        // drop callback unwinds through it): the job was then never accepted.
        let mut unresolved = Unresolved::new(&shared.counters);
        let (index, job) = match self.enqueue((index, job)) {
            Ok(evicted) => {
                unresolved.disarm();
                self.drop_evicted(evicted);
                return Ok(index);
            }
            Err(Refused::Full(item)) if shared.overflow == Overflow::Block => item,
            Err(refused) => {
                unresolved.disarm();
                return Err(self.refuse(refused).into());
            }
        };
        // Slow path: wait for room. The send keeps the job until it is queued, so however
        // the wait ends, the job is either in the queue or back in our hands.
        let mut send = shared.queue.send((index, job));
        let (cancelled, unsent) = if own {
            // Cancelling this token closes the queue (the pool's hook), which ends the send:
            // no registration on the token. The common case (a service passes its token to
            // the pool and to its submits) and the cheap one.
            match (&mut send).await {
                Ok(()) => (false, None),
                Err(unsent) => (token.is_cancelled(), Some(unsent)),
            }
        } else {
            // Any other token is watched beside the send. The pool's own cancellation closes
            // the queue, which ends the send: no need to watch its token here.
            let sent = tokio::select! {
                biased;
                () = token.cancelled() => None,
                sent = &mut send => Some(sent),
            };
            match sent {
                Some(Ok(())) => (false, None),
                Some(Err(unsent)) => (false, Some(unsent)),
                None => (true, send.into_item()),
            }
        };
        unresolved.disarm();
        let Some((index, job)) = unsent else {
            return Ok(index);
        };
        if cancelled {
            Counters::add(&shared.counters.refused, 1);
            return Err(SubmitError::Cancelled(job));
        }
        Err(self.refuse(Refused::Closed((index, job))).into())
    }

    /// Queues `job` if that is possible without waiting. Returns the job's index.
    ///
    /// With [`Overflow::DropOldest`] a full queue drops its oldest job instead of refusing.
    ///
    /// # Errors
    ///
    /// [`TrySubmitError::Full`] with the job when the queue is full, or
    /// [`TrySubmitError::Closed`] when the pool is closed.
    pub fn try_submit(&self, job: J) -> Result<u64, TrySubmitError<J>> {
        let counters = &self.handle.shared.counters;
        let index = counters.next_index.fetch_add(1, Ordering::Relaxed);
        let mut unresolved = Unresolved::new(counters);
        match self.enqueue((index, job)) {
            Ok(evicted) => {
                unresolved.disarm();
                self.drop_evicted(evicted);
                Ok(index)
            }
            Err(refused) => {
                unresolved.disarm();
                Err(self.refuse(refused))
            }
        }
    }

    /// Counts a submission that was not accepted and turns it into the error for the caller.
    fn refuse(&self, refused: Refused<J>) -> TrySubmitError<J> {
        let counters = &self.handle.shared.counters;
        Counters::add(&counters.refused, 1);
        Counters::add(&counters.rejected, 1);
        match refused {
            Refused::Full((_, job)) => TrySubmitError::Full(job),
            Refused::Closed((_, job)) => TrySubmitError::Closed(job),
        }
    }

    /// One attempt to queue, applying the drop-oldest policy.
    /// On success returns the job evicted to make room (drop-oldest); the caller settles its
    /// own accounting first, then calls [`drop_evicted`](Self::drop_evicted), so that a
    /// panicking `on_dropped` callback cannot make an accepted job look refused.
    fn enqueue(&self, item: (u64, J)) -> Result<Option<(u64, J)>, Refused<J>> {
        let shared = &self.handle.shared;
        if shared.overflow == Overflow::DropOldest {
            // The oldest job comes out and the new one goes in under the queue's lock: a close
            // finds every accepted job either queued or evicted (then dropped, never both).
            return shared
                .queue
                .try_send_evicting(item)
                .map_err(Refused::Closed);
        }
        match shared.queue.try_send(item) {
            Ok(()) => Ok(None),
            Err(TrySendError::Full(item)) => Err(Refused::Full(item)),
            Err(TrySendError::Closed(item)) => Err(Refused::Closed(item)),
        }
    }

    /// Counts an evicted job as dropped and hands it to `on_dropped`.
    fn drop_evicted(&self, evicted: Option<(u64, J)>) {
        let Some((index, job)) = evicted else {
            return;
        };
        let shared = &self.handle.shared;
        Counters::add(&shared.counters.dropped, 1);
        tracing::debug!(pool = %shared.name, job = index, "queue full: oldest job dropped");
        shared.discard(index, job);
    }

    /// Takes the results stream, if it was enabled with
    /// [`WorkerPoolBuilder::results`] and not taken yet.
    ///
    /// Take it before closing (a close drops a stream nobody took), and drain it while
    /// `close` runs: a full stream makes the workers wait, so a caller that awaits `close`
    /// before reading more than the stream's capacity waits for ever. After a cancellation the
    /// workers no longer wait on a full stream; outcomes that do not fit are only counted.
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
        self.handle
            .shared
            .results
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Stops intake, lets the queued jobs finish, and resolves when every worker has exited.
    ///
    /// Idempotent: every call waits for the same end; the handed-back jobs (only when the
    /// token was cancelled) go to the first call that collects them.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the pool closed and draining; call again to
    /// wait.
    pub async fn close(&self) -> CloseReport<J> {
        self.stop_intake();
        let shared = &self.handle.shared;
        shared.workers.wait().await;
        self.finish(false)
    }

    /// Like [`close`](Self::close), but when `deadline` passes first, cancels the pool's token
    /// (so running handlers see it and no queued job starts), waits for the running handlers
    /// to return, and hands back every job that never started.
    ///
    /// Handlers are expected to honour their token: one that ignores it delays this call past
    /// the deadline until it returns.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskweave_pool::WorkerPool;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let pool = WorkerPool::new(CancellationToken::new(), 1, 10, |context, _job: u32| async move {
    ///     tokio::select! {
    ///         () = context.cancelled() => Err("interrupted"),
    ///         () = tokio::time::sleep(Duration::from_secs(1)) => Ok(()),
    ///     }
    /// });
    /// for job in 0..5 {
    ///     pool.try_submit(job).unwrap();
    /// }
    /// let report = pool.close_within(Duration::from_millis(2500)).await;
    /// assert!(report.deadline_expired);
    /// assert_eq!(report.metrics.completed, 2); // jobs 0 and 1
    /// assert_eq!(report.interrupted, 1); // job 2 saw its token cancelled
    /// assert_eq!(report.handed_back.iter().map(|(_, job)| *job).collect::<Vec<_>>(), [3, 4]);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics if `deadline` is zero.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before the deadline leaves the pool closed and draining, with the
    /// deadline not applied.
    pub async fn close_within(&self, deadline: Duration) -> CloseReport<J> {
        assert!(
            !deadline.is_zero(),
            "WorkerPool::close_within: deadline must be greater than zero"
        );
        self.stop_intake();
        let shared = &self.handle.shared;
        let drained = tokio::time::timeout(deadline, shared.workers.wait()).await;
        if drained.is_ok() {
            return self.finish(false);
        }
        tracing::warn!(pool = %shared.name, ?deadline, in_flight = self.metrics().in_flight, "close deadline passed: cancelling handlers");
        shared.cancel.cancel();
        shared.workers.wait().await;
        self.finish(true)
    }

    fn stop_intake(&self) {
        let shared = &self.handle.shared;
        if shared.close_queue() {
            tracing::debug!(pool = %shared.name, "worker pool closing");
        }
        // A results stream nobody took can never be drained: drop it, so that no worker waits
        // on it (its outcomes are then only counted).
        // Taken out first, so that the stream's drop does not run under this lock.
        let untaken = lock(&shared.results).take();
        drop(untaken);
    }

    /// Hands back what is still queued (only after a cancellation) and reports.
    fn finish(&self, deadline_expired: bool) -> CloseReport<J> {
        let shared = &self.handle.shared;
        let handed_back = shared.take_unstarted();
        Counters::add(&shared.counters.handed_back, handed_back.len() as u64);
        CloseReport {
            handed_back,
            interrupted: shared.counters.interrupted(),
            deadline_expired,
            metrics: self.metrics(),
        }
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

    /// Jobs waiting in the queue.
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
        // Taken out first, so that the stream's drop does not run under this lock.
        let untaken = lock(&shared.results).take();
        drop(untaken);
        // SeqCst, paired with the last worker's exit (see `WorkerExit`).
        shared.detached.store(true, Ordering::SeqCst);
        if shared.counters.workers_alive.load(Ordering::SeqCst) == 0 {
            shared.abandon_leftovers();
        }
    }
}

/// Counts a submission as refused unless disarmed: see `submit`.
struct Unresolved<'a> {
    counters: &'a Counters,
    armed: bool,
}

impl<'a> Unresolved<'a> {
    fn new(counters: &'a Counters) -> Self {
        Unresolved {
            counters,
            armed: true,
        }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Unresolved<'_> {
    fn drop(&mut self) {
        if self.armed {
            Counters::add(&self.counters.refused, 1);
        }
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

enum Refused<J> {
    Full((u64, J)),
    Closed((u64, J)),
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // These locks only guard moves in and out of a `Vec` or an `Option`: a poisoned one is
    // still consistent.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
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
