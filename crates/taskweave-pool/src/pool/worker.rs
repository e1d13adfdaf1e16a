//! The worker loop: take a job, run the handler inside `catch_panic`, count, report.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use taskweave_supervise::catch_panic;

use super::{ResultsQueue, Shared, lock, log_cleanup_panic, log_panic};
use crate::pool::metrics::{Counters, LocalCounts, WorkerCounters};
use crate::queue::{TryRecvError, TrySendError};
use crate::{JobContext, JobError, JobResult};

/// A worker's task. `exit` is made before the task is spawned, so its exit steps also run
/// when the task is dropped without ever being polled (a runtime shutting down).
pub(crate) async fn work<J, R, E, H, Fut>(exit: WorkerExit<J, R, E>, handler: Arc<H>)
where
    E: fmt::Display,
    H: Fn(JobContext, J) -> Fut,
    Fut: Future<Output = Result<R, E>>,
{
    // `exit` runs on every way out of this function, unwinding included.
    let mut exit = exit;
    let shared = &*exit.shared;
    let held = &mut exit.held;
    let mine = &shared.counters.workers[exit.worker];
    let mut counts = LocalCounts::default();
    // Where the worker is, for the report of a panic: which job's user code was running.
    let mut at = At::Idle;
    // An outcome still to be delivered or dropped, when a handler panicked: its payload is
    // user data, and dropping it runs user code too, so it happens inside the catch.
    let mut pending = None;
    // One `catch_unwind` per poll of the loop, not per job: a panic unwinds out of
    // `run_jobs`, is recorded against the job that was running, and the loop starts again.
    // Catching per job cost about 14 ns a job, a quarter of the pool's overhead over a bare
    // channel.
    loop {
        let run = run_jobs(
            shared,
            held,
            mine,
            &mut counts,
            &mut at,
            &mut pending,
            &*handler,
        );
        let caught = catch_panic(shared.name.clone(), run)
            .without_logging()
            .await;
        let Err(panic) = caught else {
            break;
        };
        match std::mem::replace(&mut at, At::Idle) {
            At::Handler(index) => {
                if shared.cancel.is_cancelled() {
                    counts.interrupted(mine);
                }
                counts.panicked(mine);
                log_panic(&shared.name, index, &panic);
                pending = Some((index, Err(JobError::Panicked(panic))));
            }
            At::Aftermath(index) => {
                // The job was counted by its outcome already; the panic is user code that ran
                // after it (dropping the output or the error, the error's `Display`).
                Counters::add(&shared.counters.cleanup_panicked, 1);
                log_cleanup_panic(&shared.name, index, "dropping the job's outcome", &panic);
            }
            At::Idle => {
                // Not in user code: a bug of ours. Stop this worker rather than loop on it.
                log_panic(&shared.name, u64::MAX, &panic);
                break;
            }
        }
    }
}

/// Which user code a worker is running, for the report of a panic.
#[derive(Clone, Copy)]
enum At {
    /// None: the worker's own code.
    Idle,
    /// The handler of this job (and dropping its future).
    Handler(u64),
    /// What follows the job's handler: formatting, delivering or dropping its outcome.
    Aftermath(u64),
}

/// Takes and runs jobs until the queue is closed and empty, or the token is cancelled.
///
/// A worker that finds jobs queued takes its share of them under one lock (of `len` queued
/// jobs and `w` workers, `len / w`, between 1 and `take_per_worker`) into `held`, and runs
/// them in order before it looks at the queue again. A held job is still counted as queued,
/// is handed back by a deadline close like a queued one, and is no longer the drop-oldest
/// policy's to drop.
async fn run_jobs<J, R, E, H, Fut>(
    shared: &Shared<J, R, E>,
    held: &mut VecDeque<(u64, J)>,
    mine: &WorkerCounters,
    counts: &mut LocalCounts,
    at: &mut At,
    pending: &mut Option<(u64, JobResult<R, E>)>,
    handler: &H,
) where
    E: fmt::Display,
    H: Fn(JobContext, J) -> Fut,
    Fut: Future<Output = Result<R, E>>,
{
    let results = shared.results_queue.as_deref();
    if let Some((index, outcome)) = pending.take() {
        *at = At::Aftermath(index);
        settle(shared, results, index, outcome).await;
        *at = At::Idle;
    }
    let others = shared.counters.workers.len() - 1;
    loop {
        // Held jobs first, then a share of the queue; the slow path needs no token:
        // cancellation closes the queue.
        let taken = match held.pop_front() {
            Some(next) => Ok(next),
            // One at a time (the default): no share to work out, nothing held.
            None if shared.take == 1 => shared.queue.try_recv(),
            None => shared
                .queue
                .try_recv_share(others, shared.take, held)
                .map(|_| held.pop_front().expect("a share holds at least one job")),
        };
        let (index, job) = match taken {
            Ok(next) => next,
            Err(TryRecvError::Closed) => return,
            Err(TryRecvError::Empty) => match shared.queue.recv().await {
                Some(queued) => queued,
                None => return,
            },
        };
        if shared.take > 1 {
            mine.hold(held.len());
        }
        if shared.cancel.is_cancelled() {
            // Taken after the cancellation: they never start, they go back to the caller.
            // The gauge first: a snapshot may miss these jobs for an instant, never count
            // them twice.
            mine.hold(0);
            let mut returned = lock(&shared.returned);
            returned.push((index, job));
            returned.extend(held.drain(..));
            drop(returned);
            return;
        }
        counts.started(mine);
        *at = At::Handler(index);
        let outcome = handler(JobContext::new(index, Arc::clone(&shared.cancel)), job).await;
        // From here on the job has its outcome: a panic no longer makes it a panicked job.
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
                Err(JobError::Failed(error))
            }
        };
        *at = At::Aftermath(index);
        settle(shared, results, index, outcome).await;
        *at = At::Idle;
    }
}

/// Delivers an outcome to the results stream, or drops it when there is none (after logging
/// a failure). User code may run here: the error's `Display`, the outcome's `Drop`.
async fn settle<J, R, E: fmt::Display>(
    shared: &Shared<J, R, E>,
    results: Option<&ResultsQueue<R, E>>,
    index: u64,
    outcome: JobResult<R, E>,
) {
    match results {
        Some(results) => deliver(shared, results, index, outcome).await,
        None => {
            if let Err(JobError::Failed(error)) = &outcome {
                tracing::debug!(pool = %shared.name, job = index, %error, "job failed");
            }
            drop(outcome);
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
pub(crate) struct WorkerExit<J, R, E> {
    shared: Arc<Shared<J, R, E>>,
    worker: usize,
    /// Jobs the worker took out of the queue and has not started (see `run_jobs`). Here so
    /// that they are handed back on every way out, the task dropped with its runtime
    /// included.
    held: VecDeque<(u64, J)>,
}

impl<J, R, E> WorkerExit<J, R, E> {
    /// For worker number `worker`, counted in `workers_alive`.
    pub(crate) fn new(shared: Arc<Shared<J, R, E>>, worker: usize) -> Self {
        WorkerExit {
            shared,
            worker,
            held: VecDeque::new(),
        }
    }
}

impl<J, R, E> Drop for WorkerExit<J, R, E> {
    fn drop(&mut self) {
        let shared = &*self.shared;
        shared.counters.workers[self.worker].hold(0);
        if !self.held.is_empty() {
            // Never started: handed back by `close` (or dropped, counted, below).
            lock(&shared.returned).extend(self.held.drain(..));
        }
        // A handler still running here never returns: its task was dropped (its runtime shut
        // down). The job is counted as abandoned, so the books still balance.
        shared.counters.workers[self.worker].abandon_running();
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
