//! The batch runner: a finite set of jobs on at most N concurrent handlers, every result back.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

use taskweave_supervise::{TaskHandle, catch_panic};
use tokio_util::sync::CancellationToken;

use crate::context::CancelState;
use crate::pool::log_panic;
use crate::{JobContext, JobError, JobResult};
use taskweave_supervise::internal::lock;

/// What [`run`] did: every result, tagged with its job's index, and the jobs it never started.
#[non_exhaustive]
pub struct BatchReport<J, R, E> {
    /// One entry per started job, `(index, outcome)`, sorted by index.
    pub results: Vec<(usize, JobResult<R, E>)>,
    /// Jobs that never started because the token was cancelled, `(index, job)`, by index.
    pub unstarted: Vec<(usize, J)>,
    /// `true` when the token was cancelled before the run finished.
    pub cancelled: bool,
}

impl<J, R, E> BatchReport<J, R, E> {
    /// `true` when every job ran and none failed or panicked.
    #[must_use]
    pub fn is_success(&self) -> bool {
        self.unstarted.is_empty() && self.results.iter().all(|(_, outcome)| outcome.is_ok())
    }

    /// The number of jobs that failed or panicked.
    #[must_use]
    pub fn error_count(&self) -> usize {
        self.results
            .iter()
            .filter(|(_, outcome)| outcome.is_err())
            .count()
    }
}

impl<J, R, E> fmt::Debug for BatchReport<J, R, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchReport")
            .field("results", &self.results.len())
            .field("errors", &self.error_count())
            .field("unstarted", &self.unstarted.len())
            .field("cancelled", &self.cancelled)
            .finish()
    }
}

/// Runs `handler` over `jobs` with at most `workers` handlers in flight and returns every
/// result.
///
/// The jobs run on `workers` tasks spawned through `taskweave-supervise` (never more tasks
/// than jobs), each taking the next job in input order when it is free. Each handler gets a
/// [`JobContext`] with its index and `token`. A failing handler is an `Err(JobError::Failed)` in the report, a
/// panicking one an `Err(JobError::Panicked)` (logged with its backtrace); neither stops the
/// others. Cancelling `token` stops new jobs from starting: running handlers see their token
/// cancelled and are awaited, and the jobs that never started come back in
/// [`BatchReport::unstarted`].
///
/// Because the handlers run on their own tasks, a caller that awaits something else while
/// holding the report future cannot stall them (the pitfall of `buffer_unordered`, whose
/// futures only make progress while the stream is polled).
///
/// # Examples
///
/// ```
/// use taskweave_pool::{JobError, run};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let report = run(CancellationToken::new(), 3, 1..=5_u32, |_context, n| async move {
///     if n == 4 { Err(format!("job {n} failed")) } else { Ok(n * n) }
/// })
/// .await;
/// assert!(!report.cancelled);
/// assert_eq!(report.results.len(), 5);
/// assert_eq!(report.results[0].1.as_ref().unwrap(), &1);
/// assert!(matches!(&report.results[3].1, Err(JobError::Failed(e)) if e == "job 4 failed"));
/// assert_eq!(report.error_count(), 1);
/// # }
/// ```
///
/// # Panics
///
/// Panics if `workers` is zero, or when called outside a tokio runtime.
///
/// # Cancel safety
///
/// Dropping the returned future aborts the worker tasks (handlers in flight are dropped at
/// their next `.await`) and loses the report. Cancel the token instead to stop early and
/// still get every result and the unstarted jobs.
pub async fn run<I, J, R, E, H, Fut>(
    token: CancellationToken,
    workers: usize,
    jobs: I,
    handler: H,
) -> BatchReport<J, R, E>
where
    I: IntoIterator<Item = J>,
    J: Send + 'static,
    R: Send + 'static,
    E: Send + 'static,
    H: Fn(JobContext, J) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, E>> + Send + 'static,
{
    assert!(
        workers > 0,
        "taskweave_pool::run: workers must be greater than zero"
    );
    let queue: VecDeque<(usize, J)> = jobs.into_iter().enumerate().collect();
    let total = queue.len();
    let shared = Arc::new(Batch {
        // A child: a handler cancelling its context's token stops this run, not the caller.
        cancel: CancelState::new(token.child_token()),
        queue: Mutex::new(queue),
        results: Mutex::new(Vec::with_capacity(total)),
        handler,
    });
    let mut guard = AbortOnDrop(Vec::with_capacity(workers.min(total)));
    for worker in 0..workers.min(total) {
        let shared = Arc::clone(&shared);
        guard.0.push(taskweave_supervise::spawn(
            format!("batch-worker-{worker}"),
            async move { shared.work().await },
        ));
    }
    // Awaited in place, not drained: if this future is dropped mid-way, the guard still holds
    // every handle and aborts the workers.
    for handle in &mut guard.0 {
        // A worker catches every handler panic, so it can only end by returning.
        let _ = handle.await;
    }
    let cancelled = shared.cancel.is_cancelled();
    let mut results = std::mem::take(&mut *lock(&shared.results));
    results.sort_unstable_by_key(|(index, _)| *index);
    let unstarted = lock(&shared.queue).drain(..).collect();
    BatchReport {
        results,
        unstarted,
        cancelled,
    }
}

struct Batch<J, R, E, H> {
    cancel: Arc<CancelState>,
    queue: Mutex<VecDeque<(usize, J)>>,
    results: Mutex<Vec<(usize, JobResult<R, E>)>>,
    handler: H,
}

impl<J, R, E, H, Fut> Batch<J, R, E, H>
where
    H: Fn(JobContext, J) -> Fut,
    Fut: Future<Output = Result<R, E>>,
{
    async fn work(&self) {
        loop {
            if self.cancel.is_cancelled() {
                return;
            }
            let Some((index, job)) = lock(&self.queue).pop_front() else {
                return;
            };
            // The handler is called inside the caught future, so a panic in the closure itself
            // (not only in the future it returns) is caught too.
            let context = JobContext::new(index as u64, Arc::clone(&self.cancel));
            let caught = catch_panic("batch", async { (self.handler)(context, job).await })
                .without_logging()
                .await;
            let outcome = match caught {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(error)) => Err(JobError::Failed(error)),
                Err(panic) => {
                    log_panic("batch", index as u64, &panic);
                    Err(JobError::Panicked(panic))
                }
            };
            lock(&self.results).push((index, outcome));
        }
    }
}

/// Aborts the workers if `run` is dropped before they finish.
struct AbortOnDrop(Vec<TaskHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for handle in &self.0 {
            handle.abort();
        }
    }
}
