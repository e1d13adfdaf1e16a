//! The worker loop: take a job, run the handler inside `catch_panic`, count, report.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_channel::TryRecvError;
use taskweave_supervise::catch_panic;

use super::{Shared, lock, log_panic};
use crate::pool::metrics::LocalCounts;
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
    let counters = &shared.counters;
    let mine = &counters.workers[worker];
    let mut counts = LocalCounts::default();
    loop {
        // Fast path first; the slow path needs no token: cancellation closes the queue.
        let queued = match shared.queue_rx.try_recv() {
            Ok(queued) => queued,
            Err(TryRecvError::Closed) => break,
            Err(TryRecvError::Empty) => match shared.queue_rx.recv().await {
                Ok(queued) => queued,
                Err(_closed_and_empty) => break,
            },
        };
        let Some((index, job)) = queued.into_parts() else {
            continue;
        };
        if shared.cancel.is_cancelled() {
            // Taken after the cancellation: it never starts, it goes back to the caller.
            lock(&shared.returned).push((index, job));
            break;
        }
        counts.started(mine);
        let context = JobContext::new(index, Arc::clone(&shared.cancel));
        // The handler is called inside the caught future, so a panic in the closure itself is
        // caught too; the panic is logged here, with the job's index.
        let caught = catch_panic(shared.name.clone(), async { handler(context, job).await })
            .without_logging()
            .await;
        let outcome = match caught {
            Ok(Ok(value)) => {
                counts.completed(mine);
                Ok(value)
            }
            Ok(Err(error)) => {
                counts.failed(mine);
                if results.is_none() {
                    tracing::warn!(pool = %shared.name, job = index, %error, "job failed");
                }
                Err(JobError::Failed(error))
            }
            Err(panic) => {
                counts.panicked(mine);
                log_panic(&shared.name, index, &panic);
                Err(JobError::Panicked(panic))
            }
        };
        if let Some(results) = &results {
            // A dropped results stream is allowed: the outcome is then only counted.
            let _ = results.send((index, outcome)).await;
        }
    }
    // The last worker out closes the queue, so that submitters see `Closed` after the token was
    // cancelled, and wakes the ones blocked on a full queue.
    if counters
        .workers_alive
        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed)
        == 1
    {
        shared.close_queue();
    }
}
