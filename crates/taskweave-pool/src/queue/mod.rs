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
//! - taking every queued item at once ([`drain`](Queue::drain));
//! - hysteresis for a full queue ([`with_resume_at`](Queue::with_resume_at)): once full, it
//!   takes no item until it has drained to a given length, so that a blocked sender is woken
//!   once per many freed slots instead of once per slot.
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
//! Cost of the lists: O(1) for every step, joining, leaving from anywhere, being woken,
//! waiting again (`waiters.rs`: a list linked through a slab). It used to be a walk of the
//! list, so that thousands of blocked submitters cancelled at once cost O(n²) under the lock.
//!
//! Checked by poll-level tests and a multi-thread stress test (`tests.rs`), and by loom
//! models (`loom_models.rs`).

mod recv;
mod send;
mod waiters;

#[cfg(all(test, taskweave_loom))]
use loom::sync::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::fmt;
use std::sync::PoisonError;
#[cfg(not(all(test, taskweave_loom)))]
use std::sync::{Mutex, MutexGuard};
use std::task::Waker;

pub(crate) use waiters::WaiterId;
use waiters::{Waiters, Woken};

/// A bounded FIFO queue with async send and receive for any number of producers and
/// consumers, and a close that ends both sides.
pub(crate) struct Queue<T> {
    state: Mutex<State<T>>,
    capacity: usize,
    /// Once full, the queue takes no item until it holds at most this many (`capacity - 1`:
    /// an item is taken as soon as a slot frees).
    resume_at: usize,
    /// `resume_at < capacity - 1`: only then does `State::limit` ever change, and only then
    /// does a receive look at it, so a queue without hysteresis takes the paths it took
    /// before hysteresis existed.
    hysteresis: bool,
}

struct State<T> {
    items: VecDeque<T>,
    closed: bool,
    /// How far a send may fill the queue: `capacity`, or 0 while a queue with hysteresis
    /// drains after filling up (from the first receive of a full queue until it has drained
    /// to `resume_at`).
    limit: usize,
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

/// The future of [`Queue::send`]: `Ok` once the item is queued, `Err(item)` if the queue is
/// closed first.
///
/// Cancel safe in the sense the pool needs: until it completes the item stays in the future,
/// and [`into_item`](Self::into_item) takes it back (dropping the future drops it).
pub(crate) struct SendFuture<'a, T> {
    queue: &'a Queue<T>,
    item: Option<T>,
    waiter: Option<WaiterId>,
}

/// The future of [`Queue::recv`].
pub(crate) struct RecvFuture<'a, T> {
    queue: &'a Queue<T>,
    waiter: Option<WaiterId>,
}

impl<T> Queue<T> {
    /// A queue that holds at most `capacity` items (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "a queue holds at least one item");
        Self::with_resume_at(capacity, capacity - 1)
    }

    /// A queue that holds at most `capacity` items and, once full, takes no item (a send
    /// waits, a `try_send` is refused) until it has drained to `resume_at` items; then as many
    /// waiting senders as there is room for are woken, the longest waiting first. The
    /// evicting sends ignore it: they never wait.
    pub(crate) fn with_resume_at(capacity: usize, resume_at: usize) -> Self {
        assert!(capacity > 0, "a queue holds at least one item");
        assert!(resume_at < capacity, "a queue resumes below its capacity");
        Queue {
            state: Mutex::new(State {
                // Grows as needed: a large capacity costs nothing until it is used.
                items: VecDeque::new(),
                closed: false,
                limit: capacity,
                receivers: Waiters::default(),
                senders: Waiters::default(),
                next_id: 0,
            }),
            capacity,
            resume_at,
            hysteresis: resume_at < capacity - 1,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Nothing under the lock can leave the state half-changed (no user code runs there),
        // so a poisoned lock still guards a consistent queue.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many items a send may add now: none while the queue drains after filling up.
    fn room(&self, state: &State<T>) -> usize {
        state.limit.saturating_sub(state.items.len())
    }

    /// After `taken` items were taken out of `before`: the waiting senders to wake (after the
    /// lock is released), one per item taken.
    fn senders_to_wake(&self, state: &mut State<T>, before: usize, taken: usize) -> Woken {
        if self.hysteresis {
            return self.hold_or_resume(state, before, taken);
        }
        state.senders.pop_up_to(taken)
    }

    /// `senders_to_wake` for a queue with hysteresis: a receive from a full queue holds it
    /// (no room) until it has drained to `resume_at`; then as many waiting senders as there
    /// is room for are woken. A receive from a queue that is neither full nor held wakes one
    /// per item taken, as without hysteresis (a woken sender may not have used its turn yet).
    fn hold_or_resume(&self, state: &mut State<T>, before: usize, taken: usize) -> Woken {
        let len = state.items.len();
        if state.limit != 0 && before < self.capacity {
            return state.senders.pop_up_to(taken);
        }
        if len > self.resume_at {
            state.limit = 0;
            return Woken::None;
        }
        state.limit = self.capacity;
        state.senders.pop_up_to(self.capacity - len)
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
        if state.items.len() >= state.limit {
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

    /// Queues as many items from the front of `items` as there is room for, under one lock,
    /// and wakes as many waiting receivers; the rest stay in `items`. Returns how many were
    /// queued, or `Err(())` (nothing queued) when the queue is closed.
    pub(crate) fn try_send_many(&self, items: &mut VecDeque<T>) -> Result<usize, ()> {
        let mut state = self.lock();
        if state.closed {
            return Err(());
        }
        let sent = self.room(&state).min(items.len());
        state.items.extend(items.drain(..sent));
        let receivers = state.receivers.pop_up_to(sent);
        drop(state);
        receivers.wake();
        Ok(sent)
    }

    /// Queues every item of `items`, taking the oldest items out to make room, in the same
    /// step (of a batch larger than the capacity, its own first items are taken out).
    /// Returns what was taken out, oldest first; `Err` hands `items` back when the queue is
    /// closed.
    pub(crate) fn try_send_many_evicting(&self, items: Vec<T>) -> Result<Vec<T>, Vec<T>> {
        let mut state = self.lock();
        if state.closed {
            return Err(items);
        }
        let sent = items.len();
        state.items.extend(items);
        let over = state.items.len().saturating_sub(self.capacity);
        let evicted: Vec<T> = state.items.drain(..over).collect();
        // One receiver per item queued: never more than the queue holds.
        let receivers = state.receivers.pop_up_to(sent.min(self.capacity));
        drop(state);
        receivers.wake();
        Ok(evicted)
    }

    /// Takes one receiver's share of the queued items without waiting: of `len` items, with
    /// `others` other receivers, `len / (others + 1)`, at least one and at most `max`, moved
    /// into `into` under one lock. As many waiting senders as items taken are woken.
    pub(crate) fn try_recv_share(
        &self,
        others: usize,
        max: usize,
        into: &mut VecDeque<T>,
    ) -> Result<usize, TryRecvError> {
        let mut state = self.lock();
        let len = state.items.len();
        if len == 0 {
            return Err(if state.closed {
                TryRecvError::Closed
            } else {
                TryRecvError::Empty
            });
        }
        let taken = (len / others.saturating_add(1)).clamp(1, max.max(1));
        into.extend(state.items.drain(..taken));
        let senders = self.senders_to_wake(&mut state, len, taken);
        drop(state);
        senders.wake();
        Ok(taken)
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
        if self.hysteresis {
            let before = state.items.len() + 1;
            let senders = self.hold_or_resume(&mut state, before, 1);
            drop(state);
            senders.wake();
            return Ok(item);
        }
        let sender = state.senders.pop();
        drop(state);
        wake(sender);
        Ok(item)
    }

    /// Takes every queued item, oldest first; as many waiting senders as items taken are woken.
    pub(crate) fn drain(&self) -> Vec<T> {
        let mut state = self.lock();
        let items: Vec<T> = state.items.drain(..).collect();
        let senders = self.senders_to_wake(&mut state, items.len(), items.len());
        drop(state);
        senders.wake();
        items
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

fn wake(waker: Option<Waker>) {
    if let Some(waker) = waker {
        waker.wake();
    }
}

#[cfg(all(test, not(taskweave_loom)))]
mod tests;

#[cfg(all(test, taskweave_loom))]
mod loom_models;
