//! `Results`: the pool-owned stream of job outcomes in completion order.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use futures::Stream;
use futures::stream::FusedStream;

use taskweave_supervise::TaskName;
use taskweave_supervise::internal::drop_caught;

use super::{ResultsQueue, lock};
use crate::JobResult;
use crate::queue::WaiterId;

/// The outcomes of a [`WorkerPool`](crate::WorkerPool)'s jobs, `(index, outcome)` in the order
/// they were delivered (completion order, except that under backpressure a worker that
/// finished later may deliver first); taken once with
/// [`WorkerPool::results`](crate::WorkerPool::results).
///
/// The queue behind it is bounded (the capacity given to
/// [`WorkerPoolBuilder::results`](crate::WorkerPoolBuilder::results)): a consumer that falls
/// behind slows the workers down instead of growing memory. A poll that finds nothing taken
/// takes every outcome queued at that moment in one step (one lock round trip with the
/// workers instead of one per outcome), so up to twice that capacity may be held: outcomes
/// the stream took and has not yet handed out, and as many queued behind them.
///
/// Dropping the stream is allowed; outcomes are then only counted. The stream ends after the
/// last worker has exited, which is only once nobody can submit any more (the pool closed or
/// every handle dropped): a reader that holds a handle it never closes waits for ever; see
/// [`WorkerPool::into_results`](crate::WorkerPool::into_results). `size_hint` reports the outcomes already buffered as its lower
/// bound.
#[must_use = "streams do nothing unless polled"]
pub struct Results<R, E> {
    queue: Arc<ResultsQueue<R, E>>,
    /// This stream's place in the queue's wait list while it waits for an outcome.
    waiter: Option<WaiterId>,
    /// Outcomes taken from the queue in one go, handed out one by one. Behind a `Mutex` only
    /// so that `Results` is `Sync` whenever the outcomes are `Send` (as with the queue);
    /// polling reaches it through `get_mut`, which takes no lock.
    taken: Mutex<VecDeque<(u64, JobResult<R, E>)>>,
    done: bool,
    /// The pool's name, for the log of an outcome whose `Drop` panics.
    pool: TaskName,
}

impl<R, E> Results<R, E> {
    pub(crate) fn new(queue: Arc<ResultsQueue<R, E>>, pool: TaskName) -> Self {
        Results {
            queue,
            waiter: None,
            taken: Mutex::new(VecDeque::new()),
            done: false,
            pool,
        }
    }
}

impl<R, E> Results<R, E> {
    /// Outcomes taken and not yet handed out, and those still queued.
    fn buffered(&self) -> usize {
        lock(&self.taken).len() + self.queue.len()
    }
}

// Nothing in `Results` is ever pinned: outcomes are moved out, never polled in place.
impl<R, E> Unpin for Results<R, E> {}

impl<R, E> Stream for Results<R, E> {
    type Item = (u64, JobResult<R, E>);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let taken = this.taken.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(outcome) = taken.pop_front() {
            return Poll::Ready(Some(outcome));
        }
        if this.done {
            return Poll::Ready(None);
        }
        // Everything buffered in one lock: far fewer lock round trips with the workers.
        ready!(this.queue.poll_recv_all(&mut this.waiter, cx, taken));
        let next = taken.pop_front();
        this.done = next.is_none();
        Poll::Ready(next)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            (0, Some(0))
        } else {
            (self.buffered(), None)
        }
    }
}

impl<R, E> FusedStream for Results<R, E> {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl<R, E> Drop for Results<R, E> {
    fn drop(&mut self) {
        self.queue.leave_recv(&mut self.waiter);
        // Nobody reads any more: workers stop waiting on a full stream, and later outcomes
        // are only counted. Those already buffered are freed now, not with the pool, each in
        // a catch of its own: their `Drop` is user code, and one that panics must neither
        // skip the others nor escape into whoever dropped the stream (the pool's last handle,
        // `close`), nor abort the process with a second panic.
        self.queue.close();
        let taken = std::mem::take(self.taken.get_mut().unwrap_or_else(PoisonError::into_inner));
        for outcome in taken.into_iter().chain(self.queue.drain()) {
            drop_caught(&self.pool, outcome);
        }
    }
}

impl<R, E> fmt::Debug for Results<R, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Results")
            .field("buffered", &self.buffered())
            .field("done", &self.done)
            .finish()
    }
}
