//! Resizing: a grow frees permits, a shrink takes free ones and owes the rest (the debt).

use super::{Ordering, State, Waiters, Wakers};
use crate::AcquireError;

impl State {
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
            (waiter.wanted > capacity).then_some(AcquireError::TooLarge {
                requested: waiter.wanted,
                capacity,
            })
        });
        // Also clears the flag when the queue emptied and nothing is owed.
        self.distribute(waiters, returned, wakers);
    }

    /// Permits given up for good: they pay what a shrink still owes, and the rest lower the
    /// capacity. The last permit forgotten closes the semaphore.
    pub(crate) fn forget(&self, permits: usize) {
        let mut waiters = self.lock();
        let paid = permits.min(waiters.debt);
        waiters.debt -= paid;
        let lowered = permits - paid;
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
