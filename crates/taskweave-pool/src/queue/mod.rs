//! `Queue`: the pool's bounded multi-producer, multi-consumer queue, for its jobs and for its
//! results stream.
//!
//! One mutex guards the items and both wait lists. Why not async-channel (which the pool used
//! before) or flume: measured side by side (`docs/benchmarks.md`, pool section), a
//! hand-written pool on this queue ran 100k trivial jobs in 2.9–3.1 ms on the current-thread
//! runtime, against 7.6–8.1 ms on async-channel and 3.7–3.8 ms on flume, and it was faster on
//! the multi-thread runtime too; the `WorkerPool` on it, with its panic capture and
//! accounting, takes 0.51–0.66 × the time of the hand-written async-channel pool on trivial
//! jobs (`cargo bench -p taskweave-benches --bench pool`). async-channel pays a lock-free push or pop *and*
//! the lock of its event list whenever anyone waits, which in a pool is nearly always; here
//! the one lock does both. The pool also needs three things neither channel offers:
//!
//! - dropping the oldest item and queueing the new one in one step
//!   ([`try_send_evicting`](Queue::try_send_evicting)), so no close can see the queue between
//!   the two;
//! - a waiting send that hands its item back when it gives up ([`SendFuture::into_item`]), so a
//!   `submit` watching a token needs no side slot to recover its job;
//! - taking every queued item at once ([`drain`](Queue::drain)).
//!
//! Wake-ups: every change that can let a waiter progress (an item in, an item out, close)
//! is made under the lock, and takes the waker of the longest waiter of the other side under
//! the same lock; it is woken after the lock is released. A waiter that was woken but is
//! dropped before it uses its turn passes it on to the next one, so no wake-up is lost. A
//! woken waiter that finds its turn taken by a newcomer (the queue does not reserve a turn)
//! goes back to the front of its list.
//!
//! No user code runs under the lock: items are never dropped there, and wakers are only
//! cloned, compared and taken there (a waker replaced or taken off a list is dropped after
//! the lock is released).
//!
//! Cost of the lists: a woken waiter is found in a short list of wake-ups in flight, but one
//! that leaves without being woken (a cancelled `submit`), or is polled again while listed,
//! is looked up by a walk of its side's list under the lock: fine for the tens of waiters a
//! pool sees, quadratic if thousands of blocked submitters are all cancelled at once.
//!
//! Checked by poll-level tests and a multi-thread stress test (`tests.rs`), and by loom
//! models (`loom_models.rs`).

#[cfg(all(test, taskweave_loom))]
use loom::sync::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::PoisonError;
#[cfg(not(all(test, taskweave_loom)))]
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// A bounded FIFO queue with async send and receive for any number of producers and
/// consumers, and a close that ends both sides.
pub(crate) struct Queue<T> {
    state: Mutex<State<T>>,
    capacity: usize,
}

struct State<T> {
    items: VecDeque<T>,
    closed: bool,
    receivers: Waiters,
    senders: Waiters,
    /// The next waiter's id; ids are unique for the queue's life.
    next_id: u64,
}

/// Why [`Queue::try_send`] handed the item back.
pub(crate) enum TrySendError<T> {
    Full(T),
    Closed(T),
}

/// Why [`Queue::try_recv`] has no item.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TryRecvError {
    Empty,
    /// Closed and empty: no item will ever come.
    Closed,
}

impl<T> Queue<T> {
    /// A queue that holds at most `capacity` items (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "a queue holds at least one item");
        Queue {
            state: Mutex::new(State {
                // Grows as needed: a large capacity costs nothing until it is used.
                items: VecDeque::new(),
                closed: false,
                receivers: Waiters::default(),
                senders: Waiters::default(),
                next_id: 0,
            }),
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Nothing under the lock can leave the state half-changed (no user code runs there),
        // so a poisoned lock still guards a consistent queue.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Items queued now.
    pub(crate) fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// `true` once [`close`](Self::close) was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Refuses every later send and wakes every waiter; receivers still get the queued
    /// items, then `None`. Returns `true` for the call that closed the queue.
    pub(crate) fn close(&self) -> bool {
        let mut state = self.lock();
        if state.closed {
            return false;
        }
        state.closed = true;
        let mut wakers = state.receivers.take_all();
        wakers.extend(state.senders.take_all());
        drop(state);
        wakers.into_iter().for_each(Waker::wake);
        true
    }

    /// Queues `item` if there is room, without waiting.
    pub(crate) fn try_send(&self, item: T) -> Result<(), TrySendError<T>> {
        let mut state = self.lock();
        if state.closed {
            return Err(TrySendError::Closed(item));
        }
        if state.items.len() == self.capacity {
            return Err(TrySendError::Full(item));
        }
        state.items.push_back(item);
        let receiver = state.receivers.pop();
        drop(state);
        wake(receiver);
        Ok(())
    }

    /// Queues `item`; when the queue is full, takes the oldest item out in the same step and
    /// returns it. `Err` hands `item` back when the queue is closed.
    pub(crate) fn try_send_evicting(&self, item: T) -> Result<Option<T>, T> {
        let mut state = self.lock();
        if state.closed {
            return Err(item);
        }
        let evicted = if state.items.len() == self.capacity {
            state.items.pop_front()
        } else {
            None
        };
        state.items.push_back(item);
        let receiver = state.receivers.pop();
        drop(state);
        wake(receiver);
        Ok(evicted)
    }

    /// Queues `item`, waiting for room. See [`SendFuture`].
    pub(crate) fn send(&self, item: T) -> SendFuture<'_, T> {
        SendFuture {
            queue: self,
            item: Some(item),
            waiter: None,
        }
    }

    /// Takes the oldest item without waiting.
    pub(crate) fn try_recv(&self) -> Result<T, TryRecvError> {
        let mut state = self.lock();
        let Some(item) = state.items.pop_front() else {
            return Err(if state.closed {
                TryRecvError::Closed
            } else {
                TryRecvError::Empty
            });
        };
        let sender = state.senders.pop();
        drop(state);
        wake(sender);
        Ok(item)
    }

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
        waiter: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<T>> {
        let mut guard = self.lock();
        let state = &mut *guard;
        if let Some(item) = state.items.pop_front() {
            let left = state.receivers.leave(waiter);
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
        waiter: &mut Option<u64>,
        cx: &mut Context<'_>,
        into: &mut VecDeque<T>,
    ) -> Poll<()> {
        let mut guard = self.lock();
        let state = &mut *guard;
        if !state.items.is_empty() {
            let taken = state.items.len();
            into.extend(state.items.drain(..));
            let left = state.receivers.leave(waiter);
            let senders = state.senders.pop_up_to(taken);
            drop(guard);
            drop(left);
            senders.into_iter().for_each(Waker::wake);
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
    pub(crate) fn leave_recv(&self, waiter: &mut Option<u64>) {
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

    /// Takes every queued item, oldest first; as many waiting senders as items taken are woken.
    pub(crate) fn drain(&self) -> Vec<T> {
        let mut state = self.lock();
        let items: Vec<T> = state.items.drain(..).collect();
        let senders = state.senders.pop_up_to(items.len());
        drop(state);
        senders.into_iter().for_each(Waker::wake);
        items
    }
}

#[cfg(test)]
impl<T> Queue<T> {
    /// The bookkeeping of both sides, `[listed receivers, woken receivers, listed senders,
    /// woken senders]`: all zero once nobody waits and every wake-up was used or given up.
    pub(crate) fn waiters(&self) -> [usize; 4] {
        let state = self.lock();
        [
            state.receivers.list.len(),
            state.receivers.woken.len(),
            state.senders.list.len(),
            state.senders.woken.len(),
        ]
    }
}

impl<T> fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("Queue")
            .field("len", &state.items.len())
            .field("capacity", &self.capacity)
            .field("closed", &state.closed)
            .finish_non_exhaustive()
    }
}

/// The future of [`Queue::send`]: `Ok` once the item is queued, `Err(item)` if the queue is
/// closed first.
///
/// Cancel safe in the sense the pool needs: until it completes the item stays in the future,
/// and [`into_item`](Self::into_item) takes it back (dropping the future drops it).
pub(crate) struct SendFuture<'a, T> {
    queue: &'a Queue<T>,
    item: Option<T>,
    waiter: Option<u64>,
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
        if state.items.len() < queue.capacity {
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
            if matches!(left, Left::Woken) && !state.closed && state.items.len() < queue.capacity {
                state.senders.pop()
            } else {
                None
            };
        drop(state);
        drop(left);
        wake(next);
    }
}

/// The future of [`Queue::recv`].
pub(crate) struct RecvFuture<'a, T> {
    queue: &'a Queue<T>,
    waiter: Option<u64>,
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

/// One side's waiters, longest waiting first, and those woken that have not yet used or
/// given up their turn.
#[derive(Default)]
struct Waiters {
    list: VecDeque<(u64, Waker)>,
    /// Ids taken off `list` by [`pop`](Self::pop): one per wake-up in flight, so a short
    /// list. A waiter that completes after a wake-up (the common case) is found here without
    /// a walk of `list`.
    woken: Vec<u64>,
}

/// What [`Waiters::leave`] found. It may hold a waker: drop it after the lock is released.
#[must_use]
enum Left {
    /// Not waiting, or woken by a close (which leaves no turn to pass on).
    Absent,
    /// On the list, never woken.
    Listed { _waker: Waker },
    /// Woken, holding a turn it has not used.
    Woken,
}

impl Waiters {
    fn position(&self, id: u64) -> Option<usize> {
        self.list.iter().position(|(listed, _)| *listed == id)
    }

    fn take_woken(&mut self, id: u64) -> bool {
        match self.woken.iter().position(|woken| *woken == id) {
            Some(at) => {
                self.woken.swap_remove(at);
                true
            }
            None => false,
        }
    }

    /// Takes the longest waiter's waker, to wake once the lock is released.
    fn pop(&mut self) -> Option<Waker> {
        let (id, waker) = self.list.pop_front()?;
        self.woken.push(id);
        Some(waker)
    }

    /// The wakers of the `count` longest waiters (fewer if fewer wait).
    fn pop_up_to(&mut self, count: usize) -> Vec<Waker> {
        std::iter::from_fn(|| self.pop()).take(count).collect()
    }

    /// Every waker, for a close: each waiter then finds the queue closed, so none of them
    /// holds a turn to pass on.
    fn take_all(&mut self) -> Vec<Waker> {
        self.list.drain(..).map(|(_, waker)| waker).collect()
    }

    /// Puts the waiter on the list, or refreshes its waker if it is on it. A waiter that was
    /// woken and must wait again goes to the front: it has waited longest. Returns a waker it
    /// replaced, to drop after the lock is released.
    #[must_use]
    fn wait(
        &mut self,
        waiter: &mut Option<u64>,
        next_id: &mut u64,
        waker: &Waker,
    ) -> Option<Waker> {
        let Some(id) = *waiter else {
            let id = *next_id;
            *next_id += 1;
            *waiter = Some(id);
            self.list.push_back((id, waker.clone()));
            return None;
        };
        if !self.take_woken(id)
            && let Some(at) = self.position(id)
        {
            let listed = &mut self.list[at].1;
            if listed.will_wake(waker) {
                return None;
            }
            return Some(std::mem::replace(listed, waker.clone()));
        }
        self.list.push_front((id, waker.clone()));
        None
    }

    /// Takes the waiter off the list (if it is on it) and forgets its id.
    fn leave(&mut self, waiter: &mut Option<u64>) -> Left {
        let Some(id) = waiter.take() else {
            return Left::Absent;
        };
        if self.take_woken(id) {
            return Left::Woken;
        }
        match self.position(id).and_then(|at| self.list.remove(at)) {
            Some((_, waker)) => Left::Listed { _waker: waker },
            None => Left::Absent,
        }
    }
}

fn wake(waker: Option<Waker>) {
    if let Some(waker) = waker {
        waker.wake();
    }
}

#[cfg(all(test, not(taskweave_loom)))]
mod tests;

#[cfg(all(test, taskweave_loom))]
mod loom_models;
