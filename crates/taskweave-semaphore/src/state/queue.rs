//! Queueing: a waiter joins the wait list, polls for its grant, or gives up.

use std::sync::Arc;
use std::task::Waker;

use super::{AtomicUsize, GRANTED, Ordering, State, WAITING, Waiter, Wakers, decode};
use crate::AcquireError;

/// A queued waiter's handle: its key in the wait list and the status the list sets.
#[derive(Debug)]
pub(crate) struct Ticket {
    key: usize,
    permits: usize,
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

impl State {
    /// Joins the queue for `permits` (after a `try_acquire` found none), taking what is free
    /// on the way; served at once if that is enough and nobody is ahead.
    pub(crate) fn join(&self, permits: usize, waker: &Waker) -> Joined {
        // Made before the lock, to keep the critical section short under contention.
        let status = Arc::new(AtomicUsize::new(WAITING));
        let waker = waker.clone();
        let mut waiters = self.lock();
        if waiters.closed {
            return Joined::Failed(AcquireError::Closed);
        }
        let capacity = self.capacity();
        if permits > capacity {
            return Joined::Failed(AcquireError::TooLarge {
                requested: permits,
                capacity,
            });
        }
        // The front of the queue is never a tombstone (`distribute` drops them as they reach
        // it), so a non-empty queue means someone is waiting ahead.
        let queued = !waiters.order.is_empty();
        let wanted = permits;
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
            // `taken` is below `wanted`, a `usize`.
            assigned: taken,
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
            GRANTED => ticket.permits,
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
}
