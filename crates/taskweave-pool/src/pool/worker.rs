//! The worker loop: take a job, run the handler inside `catch_panic`, count, report.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_channel::TryRecvError;
use taskweave_supervise::catch_panic;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Overflow, Shared, log_panic};
use crate::pool::metrics::Counters;
use crate::{JobError, JobResult};

pub(crate) async fn work<J, R, E, H, Fut>(
    shared: Arc<Shared<J, R, E>>,
    handler: Arc<H>,
    results: Option<mpsc::Sender<(u64, JobResult<R, E>)>>,
) where
    E: fmt::Display,
    H: Fn(CancellationToken, J) -> Fut,
    Fut: Future<Output = Result<R, E>>,
{
    let counters = &shared.counters;
    loop {
        if shared.token.is_cancelled() {
            break;
        }
        // Fast path without registering on the token: most of the time a job is waiting.
        let next = match shared.queue_rx.try_recv() {
            Ok(item) => Some(item),
            Err(TryRecvError::Closed) => None,
            Err(TryRecvError::Empty) => tokio::select! {
                biased;
                () = shared.token.cancelled() => None,
                item = shared.queue_rx.recv() => item.ok(),
            },
        };
        let Some((index, job)) = next else {
            break;
        };
        if shared.overflow == Overflow::Block {
            shared.space.notify_one();
        }
        Counters::add(&counters.started, 1);
        let token = shared.token.clone();
        // The handler is called inside the caught future, so a panic in the closure itself is
        // caught too; the panic is logged here, with the job's index.
        let caught = catch_panic(shared.name.clone(), async { handler(token, job).await })
            .without_logging()
            .await;
        let outcome = match caught {
            Ok(Ok(value)) => {
                Counters::add(&counters.completed, 1);
                Ok(value)
            }
            Ok(Err(error)) => {
                Counters::add(&counters.failed, 1);
                if results.is_none() {
                    tracing::warn!(pool = %shared.name, job = index, %error, "job failed");
                }
                Err(JobError::Failed(error))
            }
            Err(panic) => {
                Counters::add(&counters.panicked, 1);
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
