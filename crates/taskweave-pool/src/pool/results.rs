//! `Results`: the pool-owned stream of job outcomes in completion order.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::FusedStream;
use tokio::sync::mpsc;

use crate::JobResult;

/// The outcomes of a [`WorkerPool`](crate::WorkerPool)'s jobs, `(index, outcome)` in
/// completion order; taken once with [`WorkerPool::results`](crate::WorkerPool::results).
///
/// The channel behind it is bounded (the capacity given to
/// [`WorkerPoolBuilder::results`](crate::WorkerPoolBuilder::results)): a consumer that falls
/// behind slows the workers down instead of growing memory. Dropping the stream is allowed;
/// outcomes are then only counted. The stream ends after the last worker has exited.
#[must_use = "streams do nothing unless polled"]
pub struct Results<R, E> {
    receiver: mpsc::Receiver<(u64, JobResult<R, E>)>,
    done: bool,
}

impl<R, E> Results<R, E> {
    pub(crate) fn new(receiver: mpsc::Receiver<(u64, JobResult<R, E>)>) -> Self {
        Results {
            receiver,
            done: false,
        }
    }
}

impl<R, E> Stream for Results<R, E> {
    type Item = (u64, JobResult<R, E>);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let item = std::task::ready!(self.receiver.poll_recv(cx));
        if item.is_none() {
            self.done = true;
        }
        Poll::Ready(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            (0, Some(0))
        } else {
            (self.receiver.len(), None)
        }
    }
}

impl<R, E> FusedStream for Results<R, E> {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl<R, E> fmt::Debug for Results<R, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Results")
            .field("buffered", &self.receiver.len())
            .field("done", &self.done)
            .finish()
    }
}
