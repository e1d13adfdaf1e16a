//! The wait lists: one side's waiters, longest waiting first, and the wake-ups in flight.

use std::collections::VecDeque;
use std::task::Waker;

#[cfg(test)]
use super::Queue;

/// One side's waiters, longest waiting first, and those woken that have not yet used or
/// given up their turn.
#[derive(Default)]
pub(super) struct Waiters {
    list: VecDeque<(u64, Waker)>,
    /// Ids taken off `list` by [`pop`](Self::pop): one per wake-up in flight, so a short
    /// list. A waiter that completes after a wake-up (the common case) is found here without
    /// a walk of `list`.
    woken: Vec<u64>,
}

/// What [`Waiters::leave`] found. It may hold a waker: drop it after the lock is released.
#[must_use]
pub(super) enum Left {
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
    pub(super) fn pop(&mut self) -> Option<Waker> {
        let (id, waker) = self.list.pop_front()?;
        self.woken.push(id);
        Some(waker)
    }

    /// The wakers of the `count` longest waiters (fewer if fewer wait).
    pub(super) fn pop_up_to(&mut self, count: usize) -> Vec<Waker> {
        std::iter::from_fn(|| self.pop()).take(count).collect()
    }

    /// Every waker, for a close: each waiter then finds the queue closed, so none of them
    /// holds a turn to pass on.
    pub(super) fn take_all(&mut self) -> Vec<Waker> {
        self.list.drain(..).map(|(_, waker)| waker).collect()
    }

    /// Puts the waiter on the list, or refreshes its waker if it is on it. A waiter that was
    /// woken and must wait again goes to the front: it has waited longest. Returns a waker it
    /// replaced, to drop after the lock is released.
    #[must_use]
    pub(super) fn wait(
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
    pub(super) fn leave(&mut self, waiter: &mut Option<u64>) -> Left {
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
