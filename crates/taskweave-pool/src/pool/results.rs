//! `Results`: the pool-owned stream of job outcomes in completion order.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::FusedStream;

use crate::JobResult;

/// The outcomes of a [`WorkerPool`](crate::WorkerPool)'s jobs, `(index, outcome)` in the order
/// they were delivered (completion order, except that under backpressure a worker that
/// finished later may deliver first); taken once with
/// [`WorkerPool::results`](crate::WorkerPool::results).
///
/// The channel behind it is bounded (the capacity given to
/// [`WorkerPoolBuilder::results`](crate::WorkerPoolBuilder::results)): a consumer that falls
/// behind slows the workers down instead of growing memory. Dropping the stream is allowed;
/// outcomes are then only counted. The stream ends after the last worker has exited.
/// `size_hint` reports the outcomes already buffered as its lower bound.
#[must_use = "streams do nothing unless polled"]
pub struct Results<R, E> {
    // Boxed so that `Results` is `Unpin` (async-channel's receiver is not) and `.next()`
    // works without pinning.
    receiver: Pin<Box<Receiver<R, E>>>,
}

type Receiver<R, E> = async_channel::Receiver<(u64, JobResult<R, E>)>;

impl<R, E> Results<R, E> {
    pub(crate) fn new(receiver: Receiver<R, E>) -> Self {
        Results {
            receiver: Box::pin(receiver),
        }
    }
}

impl<R, E> Stream for Results<R, E> {
    type Item = (u64, JobResult<R, E>);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.receiver.as_mut().poll_next(cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.receiver.is_terminated() {
            (0, Some(0))
        } else {
            (self.receiver.len(), None)
        }
    }
}

impl<R, E> FusedStream for Results<R, E> {
    fn is_terminated(&self) -> bool {
        self.receiver.is_terminated()
    }
}

impl<R, E> fmt::Debug for Results<R, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Results")
            .field("buffered", &self.receiver.len())
            .field("done", &self.receiver.is_terminated())
            .finish()
    }
}
