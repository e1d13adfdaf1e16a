//! The worker loop: take a job, run the handler inside `catch_panic`, count, report.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_channel::{TryRecvError, TrySendError};
use taskweave_supervise::catch_panic;

use super::{Shared, lock, log_panic};
use crate::pool::metrics::{LocalCounts, WorkerCounters};
use crate::{JobContext, JobError, JobResult};

pub(crate) async fn work<J, R, E, H, Fut>(
    shared: Arc<Shared<J, R, E>>,
    worker: usize,
    handler: Arc<H>,
    results: Option<async_channel::Sender<(u64, JobResult<R, E>)>>,
) where
    E: fmt::Display,
    H: Fn(JobContext, J) -> Fut,
    Fut: Future<Output = Result<R, E>>,
{
    // Runs on every way out of this function, unwinding included.
    let _exit = WorkerExit(&shared);
    let mine = &shared.counters.workers[worker];
    let mut counts = LocalCounts::default();
    // The index of the job whose handler is running, for the panic report.
    let mut current = None;
    // One `catch_unwind` per poll of the loop, not per job: a panic unwinds out of
    // `run_jobs`, is recorded against the job that was running, and the loop starts again.
    // Catching per job cost about 14 ns a job, a quarter of the pool's overhead over a bare
    // channel.
    loop {
        let run = run_jobs(
            &shared,
            mine,
            &mut counts,
            &mut current,
            &*handler,
            results.as_ref(),
        );
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
        if let Some(results) = &results {
            deliver(&shared, results, index, Err(JobError::Panicked(panic))).await;
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
    results: Option<&async_channel::Sender<(u64, JobResult<R, E>)>>,
) where
    E: fmt::Display,
    H: Fn(JobContext, J) -> Fut,
    Fut: Future<Output = Result<R, E>>,
{
    loop {
        // Fast path first; the slow path needs no token: cancellation closes the queue.
        let queued = match shared.queue_rx.try_recv() {
            Ok(queued) => queued,
            Err(TryRecvError::Closed) => return,
            Err(TryRecvError::Empty) => match shared.queue_rx.recv().await {
                Ok(queued) => queued,
                Err(_closed_and_empty) => return,
            },
        };
        let Some((index, job)) = queued.into_parts() else {
            continue;
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
    results: &async_channel::Sender<(u64, JobResult<R, E>)>,
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

/// The worker's exit steps, in a guard so that they also run if the worker unwinds.
struct WorkerExit<'a, J, R, E>(&'a Shared<J, R, E>);

impl<J, R, E> Drop for WorkerExit<'_, J, R, E> {
    fn drop(&mut self) {
        let shared = self.0;
        // SeqCst, paired with `Handle::drop`: of the last worker out and the last handle
        // dropped, at least one sees the other and abandons what nobody can collect any more.
        if shared.counters.workers_alive.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Submitters see `Closed` after a cancellation, and blocked ones wake up.
            shared.close_queue();
            if shared.detached.load(Ordering::SeqCst) {
                shared.abandon_leftovers();
            }
        }
    }
}
