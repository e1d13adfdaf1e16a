//! Receiving with a wait: `Queue::recv` and its `RecvFuture`, and the polling a stream uses.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::waiters::Left;
use super::{Queue, RecvFuture, WaiterId, wake};

impl<T> Queue<T> {
    /// Takes the oldest item, waiting for one; `None` once the queue is closed and empty.
    ///
    /// Cancel safe: a dropped `Recv` has taken no item.
    pub(crate) fn recv(&self) -> RecvFuture<'_, T> {
        RecvFuture {
            queue: self,
            waiter: None,
        }
    }

    /// The receiving side for an owner that is not a future (a stream): `waiter` is the
    /// owner's place in the wait list, to be given to [`leave_recv`](Self::leave_recv) when
    /// the owner is dropped.
    pub(crate) fn poll_recv(
        &self,
        waiter: &mut Option<WaiterId>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<T>> {
        let mut guard = self.lock();
        let state = &mut *guard;
        if let Some(item) = state.items.pop_front() {
            let left = state.receivers.leave(waiter);
            if self.hysteresis {
                let senders = self.hold_or_resume(state, state.items.len() + 1, 1);
                drop(guard);
                drop(left);
                senders.wake();
                return Poll::Ready(Some(item));
            }
            let sender = state.senders.pop();
            drop(guard);
            drop(left);
            wake(sender);
            return Poll::Ready(Some(item));
        }
        if state.closed {
            let left = state.receivers.leave(waiter);
            drop(guard);
            drop(left);
            return Poll::Ready(None);
        }
        let replaced = state.receivers.wait(waiter, &mut state.next_id, cx.waker());
        drop(guard);
        drop(replaced);
        Poll::Pending
    }

    /// Like [`poll_recv`](Self::poll_recv), but moves every queued item into `into` under one
    /// lock; as many waiting senders as items taken are woken. `Ready` with nothing added
    /// means closed and empty.
    pub(crate) fn poll_recv_all(
        &self,
        waiter: &mut Option<WaiterId>,
        cx: &mut Context<'_>,
        into: &mut VecDeque<T>,
    ) -> Poll<()> {
        let mut guard = self.lock();
        let state = &mut *guard;
        if !state.items.is_empty() {
            let taken = state.items.len();
            into.extend(state.items.drain(..));
            let left = state.receivers.leave(waiter);
            let senders = self.senders_to_wake(state, taken, taken);
            drop(guard);
            drop(left);
            senders.wake();
            return Poll::Ready(());
        }
        if state.closed {
            let left = state.receivers.leave(waiter);
            drop(guard);
            drop(left);
            return Poll::Ready(());
        }
        let replaced = state.receivers.wait(waiter, &mut state.next_id, cx.waker());
        drop(guard);
        drop(replaced);
        Poll::Pending
    }

    /// A receiver gives up its place; a wake-up it was given but did not use goes to the next
    /// receiver.
    pub(crate) fn leave_recv(&self, waiter: &mut Option<WaiterId>) {
        if waiter.is_none() {
            return;
        }
        let mut state = self.lock();
        let left = state.receivers.leave(waiter);
        let next = if matches!(left, Left::Woken) && !state.items.is_empty() {
            state.receivers.pop()
        } else {
            None
        };
        drop(state);
        drop(left);
        wake(next);
    }
}

impl<T> Future for RecvFuture<'_, T> {
    type Output = Option<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let this = &mut *self;
        this.queue.poll_recv(&mut this.waiter, cx)
    }
}

impl<T> Drop for RecvFuture<'_, T> {
    fn drop(&mut self) {
        self.queue.leave_recv(&mut self.waiter);
    }
}
