//! The worker loop: take a job, run the handler inside `catch_panic`, count, report.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use taskweave_supervise::catch_panic;

use super::{ResultsQueue, Shared, lock, log_panic};
use crate::pool::metrics::{LocalCounts, WorkerCounters};
use crate::queue::{TryRecvError, TrySendError};
use crate::{JobContext, JobError, JobResult};

/// A worker's task. `exit` is made before the task is spawned, so its exit steps also run
/// when the task is dropped without ever being polled (a runtime shutting down).
pub(crate) async fn work<J, R, E, H, Fut>(exit: WorkerExit<J, R, E>, worker: usize, handler: Arc<H>)
where
    E: fmt::Display,
    H: Fn(JobContext, J) -> Fut,
    Fut: Future<Output = Result<R, E>>,
{
    // `exit` runs on every way out of this function, unwinding included.
    let shared = &*exit.0;
    let results = shared.results_queue.as_deref();
    let mine = &shared.counters.workers[worker];
    let mut counts = LocalCounts::default();
    // The index of the job whose handler is running, for the panic report.
    let mut current = None;
    // One `catch_unwind` per poll of the loop, not per job: a panic unwinds out of
    // `run_jobs`, is recorded against the job that was running, and the loop starts again.
    // Catching per job cost about 14 ns a job, a quarter of the pool's overhead over a bare
    // channel.
    loop {
        let run = run_jobs(shared, mine, &mut counts, &mut current, &*handler, results);
        let caught = catch_panic(shared.name.clone(), run)
            .without_logging()
            .await;
        let Err(panic) = caught else {
            break;
        };
        let Some(index) = current.take() else {
            // Not inside a handler: a bug of ours, or a panicking `Display` of an error.
            log_panic(&shared.name, u64::MAX, &panic);
            break;
        };
        if shared.cancel.is_cancelled() {
            counts.interrupted(mine);
        }
        counts.panicked(mine);
        log_panic(&shared.name, index, &panic);
        if let Some(results) = results {
            deliver(shared, results, index, Err(JobError::Panicked(panic))).await;
        }
    }
}

/// Takes and runs jobs until the queue is closed and empty, or the token is cancelled.
async fn run_jobs<J, R, E, H, Fut>(
    shared: &Shared<J, R, E>,
    mine: &WorkerCounters,
    counts: &mut LocalCounts,
    current: &mut Option<u64>,
    handler: &H,
    results: Option<&ResultsQueue<R, E>>,
) where
    E: fmt::Display,
    H: Fn(JobContext, J) -> Fut,
    Fut: Future<Output = Result<R, E>>,
{
    loop {
        // Fast path first; the slow path needs no token: cancellation closes the queue.
        let (index, job) = match shared.queue.try_recv() {
            Ok(queued) => queued,
            Err(TryRecvError::Closed) => return,
            Err(TryRecvError::Empty) => match shared.queue.recv().await {
                Some(queued) => queued,
                None => return,
            },
        };
        if shared.cancel.is_cancelled() {
            // Taken after the cancellation: it never starts, it goes back to the caller.
            lock(&shared.returned).push((index, job));
            return;
        }
        counts.started(mine);
        *current = Some(index);
        let outcome = handler(JobContext::new(index, Arc::clone(&shared.cancel)), job).await;
        *current = None;
        if shared.cancel.is_cancelled() {
            // The handler returned after the cancellation: it was running when it came.
            counts.interrupted(mine);
        }
        let outcome = match outcome {
            Ok(value) => {
                counts.completed(mine);
                Ok(value)
            }
            Err(error) => {
                counts.failed(mine);
                if results.is_none() {
                    tracing::debug!(pool = %shared.name, job = index, %error, "job failed");
                }
                Err(JobError::Failed(error))
            }
        };
        if let Some(results) = results {
            deliver(shared, results, index, outcome).await;
        }
    }
}

/// Sends an outcome to the results stream, waiting while it is full, except after a
/// cancellation: then a full stream must not keep the worker (and `close_within`) waiting,
/// and an outcome that does not fit is only counted.
async fn deliver<J, R, E>(
    shared: &Shared<J, R, E>,
    results: &ResultsQueue<R, E>,
    index: u64,
    outcome: JobResult<R, E>,
) {
    let item = match results.try_send((index, outcome)) {
        // A dropped stream is allowed: the outcome is then only counted.
        Ok(()) | Err(TrySendError::Closed(_)) => return,
        Err(TrySendError::Full(item)) => item,
    };
    if shared.cancel.is_cancelled() {
        tracing::debug!(pool = %shared.name, job = index, "results stream full after cancellation: outcome only counted");
        return;
    }
    tokio::select! {
        biased;
        () = shared.cancel.token().cancelled() => {
            tracing::debug!(pool = %shared.name, job = index, "results stream full after cancellation: outcome only counted");
        }
        _sent = results.send(item) => {}
    }
}

/// The worker's exit steps, in a guard so that they also run if the worker unwinds or its
/// task is dropped.
pub(crate) struct WorkerExit<J, R, E>(Arc<Shared<J, R, E>>);

impl<J, R, E> WorkerExit<J, R, E> {
    /// For a worker counted in `workers_alive`.
    pub(crate) fn new(shared: Arc<Shared<J, R, E>>) -> Self {
        WorkerExit(shared)
    }
}

impl<J, R, E> Drop for WorkerExit<J, R, E> {
    fn drop(&mut self) {
        let shared = &*self.0;
        // SeqCst, paired with `Handle::drop`: of the last worker out and the last handle
        // dropped, at least one sees the other and abandons what nobody can collect any more.
        if shared.counters.workers_alive.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Submitters see `Closed` after a cancellation, and blocked ones wake up.
            shared.close_queue();
            // No outcome can come any more: the results stream ends once drained.
            if let Some(results) = &shared.results_queue {
                results.close();
            }
            if shared.detached.load(Ordering::SeqCst) {
                shared.abandon_leftovers();
            }
        }
    }
}
