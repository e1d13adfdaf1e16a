//! The wait lists: one side's waiters, longest waiting first, and the wake-ups in flight.
//!
//! A list is doubly linked through a `Slab` (tokio's slab crate): a waiter's place is its slab
//! key, so joining, leaving from anywhere (a cancelled `submit`), being woken and coming back
//! are all O(1), whatever the number of waiters. A waiter that was woken keeps its slot, off
//! the list, until it uses or gives up its turn.

use std::task::Waker;

use slab::Slab;

#[cfg(test)]
use super::Queue;

/// Where a waiter is: its slot, and the sequence number it was given, so that a slot freed and
/// reused by another waiter is never mistaken for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WaiterId {
    key: usize,
    seq: u64,
}

/// No neighbour.
const NIL: usize = usize::MAX;

struct Node {
    seq: u64,
    /// `Some` while listed; `None` once woken (off the list, holding a turn).
    waker: Option<Waker>,
    prev: usize,
    next: usize,
}

/// One side's waiters, longest waiting first, and those woken that have not yet used or
/// given up their turn.
pub(super) struct Waiters {
    nodes: Slab<Node>,
    head: usize,
    tail: usize,
    listed: usize,
    woken: usize,
}

impl Default for Waiters {
    fn default() -> Self {
        Waiters {
            nodes: Slab::new(),
            head: NIL,
            tail: NIL,
            listed: 0,
            woken: 0,
        }
    }
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
    /// The waiter's node, unless its slot was freed (a close took it off) or reused.
    fn node_mut(&mut self, id: WaiterId) -> Option<&mut Node> {
        self.nodes.get_mut(id.key).filter(|node| node.seq == id.seq)
    }

    fn unlink(&mut self, key: usize) {
        let (prev, next) = {
            let node = &self.nodes[key];
            (node.prev, node.next)
        };
        match prev {
            NIL => self.head = next,
            prev => self.nodes[prev].next = next,
        }
        match next {
            NIL => self.tail = prev,
            next => self.nodes[next].prev = prev,
        }
        self.listed -= 1;
    }

    fn link_back(&mut self, key: usize) {
        let tail = self.tail;
        {
            let node = &mut self.nodes[key];
            node.prev = tail;
            node.next = NIL;
        }
        match tail {
            NIL => self.head = key,
            tail => self.nodes[tail].next = key,
        }
        self.tail = key;
        self.listed += 1;
    }

    fn link_front(&mut self, key: usize) {
        let head = self.head;
        {
            let node = &mut self.nodes[key];
            node.prev = NIL;
            node.next = head;
        }
        match head {
            NIL => self.tail = key,
            head => self.nodes[head].prev = key,
        }
        self.head = key;
        self.listed += 1;
    }

    /// Takes the longest waiter's waker, to wake once the lock is released.
    pub(super) fn pop(&mut self) -> Option<Waker> {
        let key = self.head;
        if key == NIL {
            return None;
        }
        self.unlink(key);
        self.woken += 1;
        self.nodes[key].waker.take()
    }

    /// The wakers of the `count` longest waiters (fewer if fewer wait), to be woken after
    /// the lock is released. No allocation for none or one.
    pub(super) fn pop_up_to(&mut self, count: usize) -> Woken {
        match count {
            0 => Woken::None,
            1 => self.pop().map_or(Woken::None, Woken::One),
            _ => Woken::Many(std::iter::from_fn(|| self.pop()).take(count).collect()),
        }
    }

    /// Every listed waker, for a close: each waiter then finds the queue closed, so none of
    /// them holds a turn to pass on (their slots are freed; their ids no longer match).
    pub(super) fn take_all(&mut self) -> Vec<Waker> {
        let mut wakers = Vec::with_capacity(self.listed);
        let mut key = self.head;
        while key != NIL {
            let node = self.nodes.remove(key);
            wakers.extend(node.waker);
            key = node.next;
        }
        self.head = NIL;
        self.tail = NIL;
        self.listed = 0;
        wakers
    }

    /// Puts the waiter on the list, or refreshes its waker if it is on it. A waiter that was
    /// woken and must wait again goes to the front: it has waited longest. Returns a waker it
    /// replaced, to drop after the lock is released.
    #[must_use]
    pub(super) fn wait(
        &mut self,
        waiter: &mut Option<WaiterId>,
        next_seq: &mut u64,
        waker: &Waker,
    ) -> Option<Waker> {
        let Some(id) = *waiter else {
            let seq = *next_seq;
            *next_seq += 1;
            let key = self.nodes.insert(Node {
                seq,
                waker: Some(waker.clone()),
                prev: NIL,
                next: NIL,
            });
            self.link_back(key);
            *waiter = Some(WaiterId { key, seq });
            return None;
        };
        match self.node_mut(id) {
            Some(node) => match &mut node.waker {
                Some(listed) if listed.will_wake(waker) => None,
                Some(listed) => Some(std::mem::replace(listed, waker.clone())),
                None => {
                    // Woken, and must wait again.
                    node.waker = Some(waker.clone());
                    self.woken -= 1;
                    self.link_front(id.key);
                    None
                }
            },
            None => {
                // Taken off by a close, and waiting again (only before it saw the close).
                let key = self.nodes.insert(Node {
                    seq: id.seq,
                    waker: Some(waker.clone()),
                    prev: NIL,
                    next: NIL,
                });
                self.link_front(key);
                *waiter = Some(WaiterId { key, seq: id.seq });
                None
            }
        }
    }

    /// Takes the waiter off the list (if it is on it) and forgets its id.
    pub(super) fn leave(&mut self, waiter: &mut Option<WaiterId>) -> Left {
        let Some(id) = waiter.take() else {
            return Left::Absent;
        };
        let Some(node) = self.node_mut(id) else {
            return Left::Absent;
        };
        if node.waker.is_none() {
            self.nodes.remove(id.key);
            self.woken -= 1;
            return Left::Woken;
        }
        self.unlink(id.key);
        match self.nodes.remove(id.key).waker {
            Some(waker) => Left::Listed { _waker: waker },
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
        let [receivers, senders] = [&state.receivers, &state.senders];
        for side in [receivers, senders] {
            debug_assert_eq!(side.nodes.len(), side.listed + side.woken);
        }
        [
            receivers.listed,
            receivers.woken,
            senders.listed,
            senders.woken,
        ]
    }
}

/// Wakers taken off a wait list under the lock, woken after it.
pub(super) enum Woken {
    None,
    One(Waker),
    Many(Vec<Waker>),
}

impl Woken {
    pub(super) fn wake(self) {
        match self {
            Woken::None => {}
            Woken::One(waker) => waker.wake(),
            Woken::Many(wakers) => wakers.into_iter().for_each(Waker::wake),
        }
    }
}
