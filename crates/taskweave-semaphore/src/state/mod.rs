//! The semaphore's state, owned here: one atomic word for the free permits, and a wait list
//! under a mutex. Correctness follows from this code alone (and the loom models of it), not
//! from the orderings of any dependency.
//!
//! The word holds `free << SHIFT | CONTENDED | CLOSED`:
//! - `free`: permits nobody holds and no waiter has been assigned.
//! - `CONTENDED`: someone is queued, or a shrink still owes permits. While it is set, `free`
//!   is 0 and every release goes through the lock (to the debt first, then to the waiters in
//!   order); while it is clear, a release is one compare-and-swap on the word.
//! - `CLOSED`: nothing is granted any more.
//!
//! Every change of `free` and of the flags is a compare-and-swap on the word, so a fast
//! release and a waiter (or a shrink) that sets `CONTENDED` cannot both miss each other: one
//! of the two swaps comes first, and the other sees it.

mod queue;
mod resize;

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Waker;

#[cfg(all(test, taskweave_loom))]
use loom::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicUsize, Ordering},
};
#[cfg(not(all(test, taskweave_loom)))]
use std::sync::{
    Mutex, MutexGuard, PoisonError,
    atomic::{AtomicUsize, Ordering},
};

use slab::Slab;

use crate::{AcquireError, TryAcquireError};

pub(crate) use queue::{Joined, Polled, Ticket};

const CLOSED: usize = 1;
const CONTENDED: usize = 2;
const SHIFT: u32 = 2;

/// The most permits a semaphore can have (as tokio's): `usize::MAX >> 3`.
pub const MAX_PERMITS: usize = usize::MAX >> 3;

pub(crate) struct State {
    word: AtomicUsize,
    /// The capacity now; changed under the lock, read without it by `try_acquire`.
    capacity: AtomicUsize,
    waiters: Mutex<Waiters>,
}

struct Waiters {
    entries: Slab<Waiter>,
    /// Keys of the waiters not yet served, first come first served. An abandoned waiter
    /// stays here as a tombstone until it reaches the front (removal is then O(1)).
    order: VecDeque<usize>,
    /// Permits held that a shrink retires as they come back.
    debt: usize,
    /// Set by `close`, under the lock (the word's bit is the lock-free copy).
    closed: bool,
}

struct Waiter {
    wanted: usize,
    assigned: usize,
    waker: Option<Waker>,
    /// Shared with the waiting future: set (with `Release`) when the waiter is served or
    /// failed, at which point its entry leaves the wait list. The future reads it without
    /// the lock, so a woken waiter takes its grant with one load.
    status: Arc<AtomicUsize>,
    /// The waiter's future is gone; it is a tombstone in `order`.
    abandoned: bool,
}

const WAITING: usize = 0;
const GRANTED: usize = 1;
const FAILED_CLOSED: usize = 2;
/// `capacity << 2 | FAILED_TOO_LARGE` (a capacity is at most `MAX_PERMITS`, so it fits).
const FAILED_TOO_LARGE: usize = 3;

fn encode(outcome: Result<(), AcquireError>) -> usize {
    match outcome {
        Ok(()) => GRANTED,
        Err(AcquireError::TooLarge { capacity, .. }) => capacity << 2 | FAILED_TOO_LARGE,
        Err(_) => FAILED_CLOSED,
    }
}

fn decode(status: usize, requested: usize) -> Result<(), AcquireError> {
    match status & 3 {
        GRANTED => Ok(()),
        FAILED_TOO_LARGE => Err(AcquireError::TooLarge {
            requested,
            capacity: status >> 2,
        }),
        _ => Err(AcquireError::Closed),
    }
}

/// Wakers collected under the lock and woken after it.
#[derive(Default)]
struct Wakers {
    first: Option<Waker>,
    rest: Vec<Waker>,
}

impl Wakers {
    fn push(&mut self, waker: Option<Waker>) {
        let Some(waker) = waker else { return };
        if self.first.is_none() {
            self.first = Some(waker);
        } else {
            self.rest.push(waker);
        }
    }

    fn wake(self) {
        if let Some(first) = self.first {
            first.wake();
        }
        self.rest.into_iter().for_each(Waker::wake);
    }
}

impl State {
    pub(crate) fn new(capacity: usize) -> Self {
        State {
            word: AtomicUsize::new(capacity << SHIFT),
            capacity: AtomicUsize::new(capacity),
            waiters: Mutex::new(Waiters {
                entries: Slab::new(),
                order: VecDeque::new(),
                debt: 0,
                closed: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Waiters> {
        // Every update under this lock is completed before it is released, and no user code
        // runs under it (wakers are woken after): a poisoned lock still guards a consistent
        // wait list.
        #[cfg(not(all(test, taskweave_loom)))]
        return self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        #[cfg(all(test, taskweave_loom))]
        return self.waiters.lock().unwrap();
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Acquire)
    }

    pub(crate) fn available(&self) -> usize {
        self.word.load(Ordering::Acquire) >> SHIFT
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.word.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Held or assigned to a waiter: the capacity plus what a shrink still owes, minus the
    /// free permits.
    pub(crate) fn in_use(&self) -> usize {
        let waiters = self.lock();
        (self.capacity() + waiters.debt).saturating_sub(self.available())
    }

    /// `permits` at once if they are free and nobody is queued. Closed is checked first,
    /// then the size, then what is free.
    ///
    /// Inlined (through `Semaphore::try_acquire*`) into the caller's crate: called through a
    /// function, its result (an error type of three words) went through memory, which cost
    /// the `try_acquire` + release row 1.75 × tokio's, whose result fits in two registers.
    #[inline]
    pub(crate) fn try_acquire(&self, permits: usize) -> Result<(), TryAcquireError> {
        let wanted = permits;
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            if word & CLOSED != 0 {
                return Err(TryAcquireError::Closed);
            }
            let capacity = self.capacity();
            if wanted > capacity {
                return Err(TryAcquireError::TooLarge {
                    requested: permits,
                    capacity,
                });
            }
            if word & CONTENDED != 0 || word >> SHIFT < wanted {
                return Err(TryAcquireError::NoPermits);
            }
            match self.word.compare_exchange_weak(
                word,
                word - (wanted << SHIFT),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(current) => word = current,
            }
        }
    }

    /// Gives `permits` back: one compare-and-swap when nobody waits and nothing is owed.
    /// That path is inlined into a permit's `Drop`; the one through the lock is not.
    #[inline]
    pub(crate) fn release(&self, permits: usize) {
        if permits == 0 {
            return;
        }
        let added = permits << SHIFT;
        let mut word = self.word.load(Ordering::Acquire);
        while word & CONTENDED == 0 {
            match self.word.compare_exchange_weak(
                word,
                word + added,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(current) => word = current,
            }
        }
        self.release_contended(permits);
    }

    /// `release` when someone waits or a shrink is owed permits: under the lock.
    #[inline(never)]
    fn release_contended(&self, permits: usize) {
        let mut waiters = self.lock();
        let mut wakers = Wakers::default();
        self.distribute(&mut waiters, permits, &mut wakers);
        drop(waiters);
        wakers.wake();
    }

    /// Hands `permits` on, under the lock: to the debt first, then to the waiters in order,
    /// and the rest to the free permits; clears `CONTENDED` when nobody is left to serve.
    fn distribute(&self, waiters: &mut Waiters, mut permits: usize, wakers: &mut Wakers) {
        let paid = permits.min(waiters.debt);
        waiters.debt -= paid;
        permits -= paid;
        while let Some(&key) = waiters.order.front() {
            let waiter = &mut waiters.entries[key];
            if waiter.abandoned {
                waiters.order.pop_front();
                waiters.entries.remove(key);
                continue;
            }
            if permits == 0 {
                break;
            }
            let give = permits.min(waiter.wanted - waiter.assigned);
            // `give` is at most `wanted - assigned`, a `usize`.
            waiter.assigned += give;
            permits -= give;
            if waiter.assigned == waiter.wanted {
                waiter.status.store(GRANTED, Ordering::Release);
                wakers.push(waiter.waker.take());
                waiters.order.pop_front();
                waiters.entries.remove(key);
            }
        }
        let settled = waiters.order.is_empty() && waiters.debt == 0;
        if permits == 0 && !settled {
            return;
        }
        // Either nobody is left to serve (clear the flag and free the rest), or everything
        // went to the debt and the waiters (`permits` is 0 and the flag stays).
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            let mut next = word + (permits << SHIFT);
            if settled {
                next &= !CONTENDED;
            }
            match self
                .word
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(current) => word = current,
            }
        }
    }

    /// Takes up to `wanted` free permits and sets `CONTENDED` when `contend` (the caller will
    /// queue or owe the rest). Returns what it took. Under the lock.
    fn take_free(&self, wanted: usize, contend: impl Fn(usize) -> bool) -> usize {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            let take = wanted.min(word >> SHIFT);
            let mut next = word - (take << SHIFT);
            if contend(take) {
                next |= CONTENDED;
            }
            match self
                .word
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return take,
                Err(current) => word = current,
            }
        }
    }

    /// Closes: every queued waiter fails with `Closed`; later acquires fail. Permits they
    /// had been assigned go back to the free count, so that the books still balance.
    pub(crate) fn close(&self) {
        let mut waiters = self.lock();
        let mut wakers = Wakers::default();
        self.close_locked(&mut waiters, &mut wakers);
        drop(waiters);
        wakers.wake();
    }

    fn close_locked(&self, waiters: &mut Waiters, wakers: &mut Wakers) {
        if waiters.closed {
            return;
        }
        waiters.closed = true;
        let mut word = self.word.load(Ordering::Acquire);
        while let Err(current) = self.word.compare_exchange_weak(
            word,
            word | CLOSED,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            word = current;
        }
        let returned = Self::fail_waiting(waiters, wakers, |_| Some(AcquireError::Closed));
        self.distribute(waiters, returned, wakers);
    }

    /// Fails every queued waiter for which `why` says so; returns the permits they had been
    /// assigned.
    fn fail_waiting(
        waiters: &mut Waiters,
        wakers: &mut Wakers,
        why: impl Fn(&Waiter) -> Option<AcquireError>,
    ) -> usize {
        let mut returned = 0;
        let Waiters { entries, order, .. } = waiters;
        order.retain(|&key| {
            let waiter = &mut entries[key];
            if waiter.abandoned {
                return true;
            }
            let Some(error) = why(waiter) else {
                return true;
            };
            returned += waiter.assigned;
            waiter.status.store(encode(Err(error)), Ordering::Release);
            wakers.push(waiter.waker.take());
            entries.remove(key);
            false
        });
        returned
    }
}

#[cfg(all(test, taskweave_loom))]
mod loom_models;
