//! Sending with a wait: `Queue::send` and the `SendFuture` it returns.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::waiters::Left;
use super::{Queue, SendFuture, wake};

impl<T> Queue<T> {
    /// Queues `item`, waiting for room. See [`SendFuture`].
    pub(crate) fn send(&self, item: T) -> SendFuture<'_, T> {
        SendFuture {
            queue: self,
            item: Some(item),
            waiter: None,
        }
    }
}

impl<T> SendFuture<'_, T> {
    /// The item, unless it was queued.
    pub(crate) fn into_item(mut self) -> Option<T> {
        self.item.take()
    }
}

// The item is never pinned: the future only moves it into the queue.
impl<T> Unpin for SendFuture<'_, T> {}

impl<T> Future for SendFuture<'_, T> {
    type Output = Result<(), T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let queue = this.queue;
        let mut guard = queue.lock();
        let state = &mut *guard;
        if state.closed {
            let left = state.senders.leave(&mut this.waiter);
            drop(guard);
            drop(left);
            return Poll::Ready(Err(this.take()));
        }
        if state.items.len() < state.limit {
            state.items.push_back(this.take());
            let left = state.senders.leave(&mut this.waiter);
            let receiver = state.receivers.pop();
            drop(guard);
            drop(left);
            wake(receiver);
            return Poll::Ready(Ok(()));
        }
        let replaced = state
            .senders
            .wait(&mut this.waiter, &mut state.next_id, cx.waker());
        drop(guard);
        drop(replaced);
        Poll::Pending
    }
}

impl<T> SendFuture<'_, T> {
    fn take(&mut self) -> T {
        match self.item.take() {
            Some(item) => item,
            None => panic!("queue::SendFuture polled after it completed"),
        }
    }
}

impl<T> Drop for SendFuture<'_, T> {
    fn drop(&mut self) {
        if self.waiter.is_none() {
            return;
        }
        let queue = self.queue;
        let mut state = queue.lock();
        let left = state.senders.leave(&mut self.waiter);
        let next =
            if matches!(left, Left::Woken) && !state.closed && state.items.len() < state.limit {
                state.senders.pop()
            } else {
                None
            };
        drop(state);
        drop(left);
        wake(next);
    }
}
