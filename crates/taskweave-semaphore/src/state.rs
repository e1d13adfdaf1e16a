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
    wanted: u32,
    assigned: u32,
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

fn decode(status: usize, requested: u32) -> Result<(), AcquireError> {
    match status & 3 {
        GRANTED => Ok(()),
        FAILED_TOO_LARGE => Err(AcquireError::TooLarge {
            requested,
            capacity: status >> 2,
        }),
        _ => Err(AcquireError::Closed),
    }
}

/// A queued waiter's handle: its key in the wait list and the status the list sets.
#[derive(Debug)]
pub(crate) struct Ticket {
    key: usize,
    permits: u32,
    status: Arc<AtomicUsize>,
}

/// Where a new waiter stands after trying to join the queue.
pub(crate) enum Joined {
    /// Served at once.
    Granted,
    /// Queued.
    Queued(Ticket),
    Failed(AcquireError),
}

/// What a queued waiter's poll found.
pub(crate) enum Polled {
    Pending,
    Done(Result<(), AcquireError>),
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
    pub(crate) fn try_acquire(&self, permits: u32) -> Result<(), TryAcquireError> {
        let wanted = permits as usize;
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
    pub(crate) fn release(&self, permits: u32) {
        if permits == 0 {
            return;
        }
        let added = (permits as usize) << SHIFT;
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
        let mut waiters = self.lock();
        let mut wakers = Wakers::default();
        self.distribute(&mut waiters, permits as usize, &mut wakers);
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
            let give = permits.min((waiter.wanted - waiter.assigned) as usize);
            // `give` is at most `wanted - assigned`, a `u32`.
            waiter.assigned += u32::try_from(give).unwrap_or(u32::MAX);
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

    /// Joins the queue for `permits` (after a `try_acquire` found none), taking what is free
    /// on the way; served at once if that is enough and nobody is ahead.
    pub(crate) fn join(&self, permits: u32, waker: &Waker) -> Joined {
        // Made before the lock, to keep the critical section short under contention.
        let status = Arc::new(AtomicUsize::new(WAITING));
        let waker = waker.clone();
        let mut waiters = self.lock();
        if waiters.closed {
            return Joined::Failed(AcquireError::Closed);
        }
        let capacity = self.capacity();
        if permits as usize > capacity {
            return Joined::Failed(AcquireError::TooLarge {
                requested: permits,
                capacity,
            });
        }
        // The front of the queue is never a tombstone (`distribute` drops them as they reach
        // it), so a non-empty queue means someone is waiting ahead.
        let queued = !waiters.order.is_empty();
        let wanted = permits as usize;
        // Nobody ahead: take what is free; queue (and set the flag) only for the rest.
        let taken = if queued {
            0
        } else {
            self.take_free(wanted, |take| take < wanted)
        };
        if taken == wanted {
            return Joined::Granted;
        }
        // With someone queued ahead the flag is set already (it stays set while the queue is
        // not empty), and `take_free` above set it otherwise.
        let key = waiters.entries.insert(Waiter {
            wanted: permits,
            // `taken` is below `wanted`, a `u32`.
            assigned: u32::try_from(taken).unwrap_or(u32::MAX),
            waker: Some(waker),
            status: Arc::clone(&status),
            abandoned: false,
        });
        waiters.order.push_back(key);
        Joined::Queued(Ticket {
            key,
            permits,
            status,
        })
    }

    /// A queued waiter's poll: its outcome if it has one (one load, no lock, once served),
    /// else its waker is updated.
    pub(crate) fn poll_queued(&self, ticket: &Ticket, waker: &Waker) -> Polled {
        let status = ticket.status.load(Ordering::Acquire);
        if status != WAITING {
            return Polled::Done(decode(status, ticket.permits));
        }
        let mut waiters = self.lock();
        // Set under this lock, so a `WAITING` read here means the entry is still ours.
        let status = ticket.status.load(Ordering::Acquire);
        if status != WAITING {
            return Polled::Done(decode(status, ticket.permits));
        }
        match &mut waiters.entries[ticket.key].waker {
            Some(current) if current.will_wake(waker) => {}
            slot => *slot = Some(waker.clone()),
        }
        Polled::Pending
    }

    /// A queued waiter gives up (its token, or its future dropped): whatever it was assigned,
    /// a full grant included, goes to the waiters behind it. Returns `true` if it had been
    /// served in full (its permits were handed on).
    pub(crate) fn abandon(&self, ticket: &Ticket) -> bool {
        let mut waiters = self.lock();
        let status = ticket.status.load(Ordering::Acquire);
        let returned = match status {
            // Served: the entry is gone, the permits are the ticket's.
            GRANTED => ticket.permits as usize,
            WAITING => {
                let waiter = &mut waiters.entries[ticket.key];
                waiter.abandoned = true;
                waiter.waker = None;
                std::mem::take(&mut waiter.assigned) as usize
            }
            // Failed: it holds nothing, and its entry is gone.
            _ => return false,
        };
        let mut wakers = Wakers::default();
        // With nothing to hand on this still drops tombstones at the front and clears the
        // flag when nobody is left.
        self.distribute(&mut waiters, returned, &mut wakers);
        drop(waiters);
        wakers.wake();
        status == GRANTED
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
            returned += waiter.assigned as usize;
            waiter.status.store(encode(Err(error)), Ordering::Release);
            wakers.push(waiter.waker.take());
            entries.remove(key);
            false
        });
        returned
    }

    /// Sets the capacity to `to(old)`: a grow frees permits (paying a shrink's debt first),
    /// a shrink takes free permits and owes the rest, retired as held permits come back; a
    /// queued request above the new capacity fails with `TooLarge`. Returns the new capacity.
    pub(crate) fn resize(&self, to: impl FnOnce(usize) -> usize) -> usize {
        let mut waiters = self.lock();
        let old = self.capacity();
        let new = to(old);
        self.capacity.store(new, Ordering::Release);
        let mut wakers = Wakers::default();
        if new > old {
            self.distribute(&mut waiters, new - old, &mut wakers);
        } else if new < old {
            let shrink = old - new;
            let taken = self.take_free(shrink, |take| take < shrink);
            waiters.debt += shrink - taken;
            self.refuse_above(&mut waiters, new, &mut wakers);
        }
        drop(waiters);
        wakers.wake();
        new
    }

    /// Fails the queued requests above `capacity` with `TooLarge`, and hands on what they had
    /// been assigned (to the debt first). Under the lock.
    fn refuse_above(&self, waiters: &mut Waiters, capacity: usize, wakers: &mut Wakers) {
        let returned = Self::fail_waiting(waiters, wakers, |waiter| {
            (waiter.wanted as usize > capacity).then_some(AcquireError::TooLarge {
                requested: waiter.wanted,
                capacity,
            })
        });
        // Also clears the flag when the queue emptied and nothing is owed.
        self.distribute(waiters, returned, wakers);
    }

    /// Permits given up for good: they pay what a shrink still owes, and the rest lower the
    /// capacity. The last permit forgotten closes the semaphore.
    pub(crate) fn forget(&self, permits: u32) {
        let mut waiters = self.lock();
        let paid = (permits as usize).min(waiters.debt);
        waiters.debt -= paid;
        let lowered = permits as usize - paid;
        let capacity = self.capacity().saturating_sub(lowered);
        self.capacity.store(capacity, Ordering::Release);
        let mut wakers = Wakers::default();
        if capacity == 0 {
            // Nothing could ever be granted again: closed, and the waiters say so.
            self.close_locked(&mut waiters, &mut wakers);
        } else {
            self.refuse_above(&mut waiters, capacity, &mut wakers);
        }
        drop(waiters);
        wakers.wake();
    }

    /// The debt a shrink still owes (for the models and tests).
    #[cfg(all(test, taskweave_loom))]
    pub(crate) fn debt(&self) -> usize {
        self.lock().debt
    }
}

/// Loom models of the word and the wait list racing each other: every interleaving, on
/// loom's atomics and mutex. Run with
/// `RUSTFLAGS="--cfg taskweave_loom" cargo test -p taskweave-semaphore --lib`.
#[cfg(all(test, taskweave_loom))]
mod loom_models {
    use std::task::Waker;

    use loom::sync::Arc;
    use loom::thread;

    use super::{Joined, Polled, State};

    /// Nothing held, nothing owed, no flag left behind: the whole capacity is free.
    fn assert_settled(state: &State) {
        assert_eq!(state.debt(), 0);
        assert_eq!(state.available(), state.capacity());
        assert_eq!(state.in_use(), 0);
        assert!(state.try_acquire(1).is_ok(), "CONTENDED left set");
    }

    #[test]
    fn a_fast_release_racing_a_waiter_that_joins_is_never_lost() {
        loom::model(|| {
            let state = Arc::new(State::new(1));
            state.try_acquire(1).unwrap();
            let releaser = {
                let state = Arc::clone(&state);
                thread::spawn(move || state.release(1))
            };
            // The waiter found no permit a moment ago and joins now.
            let granted = match state.join(1, Waker::noop()) {
                Joined::Granted => true,
                Joined::Queued(ticket) => {
                    releaser.join().unwrap();
                    match state.poll_queued(&ticket, Waker::noop()) {
                        Polled::Done(outcome) => outcome.is_ok(),
                        Polled::Pending => panic!("the released permit was lost"),
                    }
                }
                Joined::Failed(error) => panic!("{error}"),
            };
            assert!(granted);
            state.release(1);
            assert_settled(&state);
        });
    }

    #[test]
    fn a_shrink_racing_a_release_retires_exactly_what_it_owes() {
        loom::model(|| {
            let state = Arc::new(State::new(2));
            state.try_acquire(2).unwrap();
            let releaser = {
                let state = Arc::clone(&state);
                thread::spawn(move || state.release(1))
            };
            state.resize(|_| 1);
            releaser.join().unwrap();
            // One permit is still held and the capacity is 1: nothing may be free.
            assert_eq!(state.available(), 0);
            assert!(state.try_acquire(1).is_err());
            state.release(1);
            assert_eq!(state.capacity(), 1);
            assert_settled(&state);
        });
    }

    #[test]
    fn an_abandoned_waiter_racing_a_release_hands_the_permit_on() {
        loom::model(|| {
            let state = Arc::new(State::new(1));
            state.try_acquire(1).unwrap();
            let Joined::Queued(ticket) = state.join(1, Waker::noop()) else {
                panic!("nothing was free");
            };
            let releaser = {
                let state = Arc::clone(&state);
                thread::spawn(move || state.release(1))
            };
            // Served or not, the permit must end up free.
            let _served = state.abandon(&ticket);
            releaser.join().unwrap();
            assert_settled(&state);
        });
    }

    #[test]
    fn a_close_racing_a_release_and_a_waiter_fails_the_waiter_and_keeps_the_books() {
        loom::model(|| {
            let state = Arc::new(State::new(1));
            state.try_acquire(1).unwrap();
            let Joined::Queued(ticket) = state.join(1, Waker::noop()) else {
                panic!("nothing was free");
            };
            let closer = {
                let state = Arc::clone(&state);
                thread::spawn(move || state.close())
            };
            state.release(1);
            closer.join().unwrap();
            match state.poll_queued(&ticket, Waker::noop()) {
                // Served before the close: it holds the permit and gives it back.
                Polled::Done(Ok(())) => state.release(1),
                Polled::Done(Err(_closed)) => {}
                Polled::Pending => panic!("the close left a waiter waiting"),
            }
            assert_eq!(state.available(), 1);
            assert!(state.try_acquire(1).is_err(), "closed");
        });
    }

    #[test]
    fn two_fast_releases_racing_a_grow_keep_every_permit() {
        loom::model(|| {
            let state = Arc::new(State::new(2));
            state.try_acquire(2).unwrap();
            let releasers: Vec<_> = (0..2)
                .map(|_| {
                    let state = Arc::clone(&state);
                    thread::spawn(move || state.release(1))
                })
                .collect();
            state.resize(|old| old + 1);
            releasers.into_iter().for_each(|t| t.join().unwrap());
            assert_eq!(state.capacity(), 3);
            assert_settled(&state);
        });
    }
}
