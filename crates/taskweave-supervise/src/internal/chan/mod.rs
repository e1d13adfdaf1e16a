//! A bounded channel with one sender and one receiver, items handed over in batches: between a
//! pipeline stage's task and its `Stage`, and between the tee's task and each of its lockstep
//! and disconnect outputs.
//!
//! Why not async-channel (which both used before) or tokio's mpsc: both hand over one
//! item per operation, a lock or CAS and a wake-up check each time, and that hand-off was most
//! of a stage's cost for small items. Here the sender pushes every item it has ready under one
//! lock and one wake-up, and the receiver takes everything queued under one lock into a buffer
//! of its own, then yields from that buffer with no lock. tokio's mpsc has `recv_many`, but an
//! item it hands over leaves the channel's count, so a receiver that buffers them would hold
//! up to a second capacity of items that nothing counts.
//!
//! **The count.** `count` is the number of items in the queue *plus* the items the receiver
//! took into its buffer and has not yielded yet, so the capacity bounds everything between
//! the sender and the consumer. The receiver gives back one unit per item it yields (a
//! `fetch_sub`), not per batch: a consumer that took one item and then waits for something
//! the sender does after its next send must not find the sender stuck behind items it
//! already consumed. A reader that takes several items in one poll of its task (a pipeline
//! stage reading the `Stage` before it, which counts what it takes against the room of its
//! own output) uses [`Receiver::poll_pop`] instead: when it needs an item it *reserves* up to
//! as many as it may take, giving back their room in one `fetch_sub` at once, and then pops
//! the reserved items one by one with no atomic at all. Reserved items wait at the front of
//! the buffer, no longer counted here.
//!
//! **Waiting for room.** The sender registers its waker, then sets `SENDER_WAITING` in
//! `count` with a `fetch_or` and reads the count that returned; the receiver's `fetch_sub`
//! returns the previous word too. Both are read-modify-writes of one atomic, so one of them
//! comes first: either the sender sees the room the receiver made, or the receiver sees the
//! flag and wakes the sender. No lost wake-up rests on a fence or on memory ordering beyond
//! the one word.
//!
//! One task sends and one consumer receives; neither side is `Clone`.
//! No user code runs under the lock: wakers are cloned before it is taken and woken or
//! dropped after it is released, and the items a closed receiver leaves are dropped outside
//! it.

use std::collections::VecDeque;
use std::mem;
use std::task::{Context, Poll, Waker, ready};

#[cfg(not(all(test, taskweave_loom)))]
use super::lock;
#[cfg(all(test, taskweave_loom))]
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(all(test, taskweave_loom))]
use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(all(test, taskweave_loom)))]
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(not(all(test, taskweave_loom)))]
use std::sync::{Arc, Mutex};

#[cfg(all(test, taskweave_loom))]
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap()
}

/// Set in `count` while the sender waits for room.
const SENDER_WAITING: usize = 1 << (usize::BITS - 1);

struct Shared<T> {
    /// Items queued plus items in the receiver's buffer; `SENDER_WAITING` on top.
    count: AtomicUsize,
    capacity: usize,
    /// The receiver registered its waker and waits for a push: a hint for the sender to
    /// hand on what it has now rather than at the end of its turn. Only a hint: no wake-up
    /// rests on it (those go through `state`).
    rx_parked: AtomicBool,
    /// The receiver is gone: `rx_closed` readable without the lock, for a sender that wants to
    /// know before it prepares a push (the push itself checks `rx_closed`).
    rx_gone: AtomicBool,
    state: Mutex<State<T>>,
}

struct State<T> {
    queue: VecDeque<T>,
    rx_waker: Option<Waker>,
    tx_waker: Option<Waker>,
    /// The sender is gone: once `queue` is empty, the receiver has seen everything.
    tx_closed: bool,
    /// The receiver is gone: the sender's pushes are refused.
    rx_closed: bool,
}

/// The receiver is gone (the `Stage` or the tee's output was dropped).
#[derive(Debug)]
pub struct Gone;

impl<T> Shared<T> {
    /// Items queued and in the receiver's buffer.
    fn len(&self) -> usize {
        self.count.load(Ordering::Acquire) & !SENDER_WAITING
    }
}

/// A channel for at most `capacity` items between the sender and the consumer.
pub fn bounded<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    debug_assert!(capacity > 0 && capacity < SENDER_WAITING);
    let shared = Arc::new(Shared {
        count: AtomicUsize::new(0),
        capacity,
        rx_parked: AtomicBool::new(false),
        rx_gone: AtomicBool::new(false),
        state: Mutex::new(State {
            queue: VecDeque::new(),
            rx_waker: None,
            tx_waker: None,
            tx_closed: false,
            rx_closed: false,
        }),
    });
    (
        Sender {
            shared: Arc::clone(&shared),
        },
        Receiver {
            shared,
            buffer: std::sync::Mutex::new(VecDeque::new()),
            reserved: 0,
            wake_owed: false,
        },
    )
}

/// The receiver's own buffer: its mutex is never locked (see `Receiver::buffer`).
fn own<T>(buffer: &mut std::sync::Mutex<VecDeque<T>>) -> &mut VecDeque<T> {
    buffer
        .get_mut()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Stores `waker` in `slot` unless the one there already wakes the same task. `fresh` was
/// cloned before the lock was taken; what is replaced is returned, to be dropped after it.
fn store_waker(slot: &mut Option<Waker>, fresh: Waker) -> Option<Waker> {
    match slot {
        Some(current) if current.will_wake(&fresh) => Some(fresh),
        _ => slot.replace(fresh),
    }
}

/// The sending side; dropping it closes the channel (the receiver yields what is left).
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Sender<T> {
    fn len(&self) -> usize {
        self.shared.len()
    }

    /// How many items fit now, without waiting. Room only grows until this sender pushes.
    pub fn room(&self) -> usize {
        self.shared.capacity.saturating_sub(self.len())
    }

    /// Waits until there is room, and returns how many items fit. Room only grows until
    /// this sender pushes, so all of them can be pushed without waiting again.
    pub fn poll_room(&self, cx: &mut Context<'_>) -> Poll<Result<usize, Gone>> {
        let capacity = self.shared.capacity;
        let len = self.len();
        if len < capacity {
            return Poll::Ready(Ok(capacity - len));
        }
        let fresh = cx.waker().clone();
        let replaced = {
            let mut state = lock(&self.shared.state);
            if state.rx_closed {
                return Poll::Ready(Err(Gone));
            }
            store_waker(&mut state.tx_waker, fresh)
        };
        drop(replaced);
        let before = self.shared.count.fetch_or(SENDER_WAITING, Ordering::AcqRel);
        let len = before & !SENDER_WAITING;
        if len < capacity {
            // The receiver made room before the flag went up: it will not wake us.
            self.shared
                .count
                .fetch_and(!SENDER_WAITING, Ordering::AcqRel);
            return Poll::Ready(Ok(capacity - len));
        }
        Poll::Pending
    }

    /// Pushes every item of `items` under one lock and wakes the receiver once. All the
    /// pushes since the last [`poll_room`](Self::poll_room) together carry no more items than
    /// the room it returned (asserted: a stage that broke this would break the capacity). When the receiver is gone the
    /// items stay in `items`, for the caller to drop.
    pub fn push(&self, items: &mut VecDeque<T>) -> Result<(), Gone> {
        if items.is_empty() {
            return Ok(());
        }
        let n = items.len();
        let waker = {
            let mut state = lock(&self.shared.state);
            if state.rx_closed {
                return Err(Gone);
            }
            assert!(
                self.len() + n <= self.shared.capacity,
                "taskweave: a sender pushed past the room of its channel"
            );
            if state.queue.is_empty() {
                // Usually so (the receiver swapped the queue out): swap back, no copy.
                mem::swap(&mut state.queue, items);
            } else {
                // Moves the items as (at most two) slices.
                state.queue.append(items);
            }
            self.shared.count.fetch_add(n, Ordering::AcqRel);
            self.shared.rx_parked.store(false, Ordering::Relaxed);
            state.rx_waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }
}

impl<T> Sender<T> {
    /// `true` once the receiver is gone: every later push is refused.
    pub fn receiver_gone(&self) -> bool {
        self.shared.rx_gone.load(Ordering::Acquire)
    }

    /// `true` while the receiver waits for items (see `Shared::rx_parked`).
    #[inline]
    pub fn receiver_parked(&self) -> bool {
        self.shared.rx_parked.load(Ordering::Acquire)
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut state = lock(&self.shared.state);
            state.tx_closed = true;
            state.rx_waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// The receiving side; dropping it refuses the sender's later pushes.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
    /// Items taken from the queue in one go, yielded from here without the lock; still
    /// counted in `count` until yielded, except the `reserved` ones at the front. Only ever
    /// reached through `&mut self` (`Mutex::get_mut`, which takes no lock): the mutex is
    /// there so that the receiver (and the pipeline's `Stage<T>`, the tee's `TeeOutput<T>`
    /// holding it) is `Sync` whenever `T: Send`, as a bare `VecDeque<T>` is only when
    /// `T: Sync`.
    buffer: std::sync::Mutex<VecDeque<T>>,
    /// Items at the front of `buffer` whose room [`poll_pop`](Self::poll_pop) already gave
    /// back: no longer in `count`.
    reserved: usize,
    /// A large reservation found the sender waiting for room: it is woken at the next
    /// [`settle`](Self::settle) (see [`DEFER_WAKE_ABOVE`]).
    wake_owed: bool,
}

/// A reservation of more items than this that finds the sender waiting for room defers its
/// wake-up to the reader's next [`Receiver::settle`] (a pipeline stage calls it at the end of
/// every poll of its turn). On the multi-thread runtime a sender woken at once tends to run
/// beside a reader that has a long turn ahead of it, on the other worker, both working the
/// channel at once; woken after the turn, it is likely to run next on the same worker (tokio
/// does not promise either). Measured with three stages at a capacity of 1,024, consumed in
/// a runtime task: 0.5–0.8 × the time; deferring every wake-up measured about 10 % slower at
/// a capacity of 32, so smaller reservations wake at once (`docs/benchmarks.md`, pipeline
/// section). The price: a reader that blocks its thread between the reservation and the
/// `settle`, waiting for the sender's next push, waits for ever (the pipeline's docs tell
/// steps to await instead).
pub const DEFER_WAKE_ABOVE: usize = 32;

impl<T> Receiver<T> {
    /// Items waiting: queued and in the buffer (reserved ones included, so after a
    /// reservation this can exceed the capacity by the items reserved).
    pub fn len(&self) -> usize {
        self.shared.len() + self.reserved
    }

    /// `true` when no item waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `true` once the sender is gone (items may still wait).
    pub fn is_closed(&self) -> bool {
        lock(&self.shared.state).tx_closed
    }

    /// Gives back the room of `n` items that left the channel, waking the sender if it
    /// waits for room.
    fn release(&self, n: usize) {
        if self.give_back(n) {
            self.wake_sender();
        }
    }

    /// Gives back the room of `n` items; `true` when the sender was waiting for room (its
    /// flag is cleared: the caller owes it the wake-up).
    fn give_back(&self, n: usize) -> bool {
        let before = self.shared.count.fetch_sub(n, Ordering::AcqRel);
        let waiting = before & SENDER_WAITING != 0;
        if waiting {
            self.shared
                .count
                .fetch_and(!SENDER_WAITING, Ordering::AcqRel);
        }
        waiting
    }

    /// Wakes the sender, if its waker is there, outside the lock.
    fn wake_sender(&self) {
        let waker = lock(&self.shared.state).tx_waker.take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Refills the empty buffer from the queue under the lock. `Some(false)`: the sender is
    /// gone and nothing is left; `None`: nothing yet.
    fn try_refill(buffer: &mut VecDeque<T>, state: &mut State<T>) -> Option<bool> {
        debug_assert!(buffer.is_empty());
        if !state.queue.is_empty() {
            // The buffer is empty: swapping keeps both allocations in use.
            mem::swap(buffer, &mut state.queue);
            Some(true)
        } else if state.tx_closed {
            Some(false)
        } else {
            None
        }
    }

    /// `Ready(true)` once the buffer holds an item, refilled from the queue if it was empty.
    /// `Ready(false)`: the sender is gone and nothing is left; `Pending`: nothing yet, and
    /// the task is woken by the next push or by the close.
    fn poll_filled(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        if !own(&mut self.buffer).is_empty() {
            return Poll::Ready(true);
        }
        let buffer = own(&mut self.buffer);
        if let Some(refilled) = Self::try_refill(buffer, &mut lock(&self.shared.state)) {
            return Poll::Ready(refilled);
        }
        // Nothing there: register, with a waker cloned outside the lock, and look again
        // under the lock that a push or the close takes too.
        let fresh = cx.waker().clone();
        let replaced = {
            let mut state = lock(&self.shared.state);
            if let Some(refilled) = Self::try_refill(buffer, &mut state) {
                return Poll::Ready(refilled);
            }
            self.shared.rx_parked.store(true, Ordering::Release);
            store_waker(&mut state.rx_waker, fresh)
        };
        drop(replaced);
        Poll::Pending
    }

    /// The next item, in order, for a reader that counts what it takes against room of its
    /// own: when no reserved item is left, it reserves up to `max` of the items ready (at least
    /// one) and gives back their room in one read-modify-write, then hands them out one per
    /// call with no atomic. So a reader that takes up to `max` items in one go pays one
    /// `fetch_sub` for all of them, and the sender gets their room back as soon as the
    /// first is taken, not as each is. `max` must be at least one.
    #[inline]
    pub fn poll_pop(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<Option<T>> {
        if self.reserved > 0 {
            self.reserved -= 1;
            return Poll::Ready(own(&mut self.buffer).pop_front());
        }
        self.poll_reserve(cx, max)
    }

    /// [`poll_pop`](Self::poll_pop) once no reserved item is left: out of line, so that the
    /// per-item path above inlines into the reader's loop.
    #[inline(never)]
    fn poll_reserve(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<Option<T>> {
        debug_assert!(max > 0);
        self.settle();
        if !ready!(self.poll_filled(cx)) {
            return Poll::Ready(None);
        }
        let buffer = own(&mut self.buffer);
        let n = buffer.len().min(max.max(1));
        let item = buffer.pop_front();
        self.reserved = n - 1;
        if self.give_back(n) {
            if n > DEFER_WAKE_ABOVE {
                self.wake_owed = true;
            } else {
                self.wake_sender();
            }
        }
        Poll::Ready(item)
    }

    /// Wakes the sender if a large reservation found it waiting for room (see
    /// [`DEFER_WAKE_ABOVE`]). A reader of [`poll_pop`](Self::poll_pop) calls it before its
    /// task returns, whatever it does next; `poll_pop` calls it before it refills or waits.
    #[inline]
    pub fn settle(&mut self) {
        if self.wake_owed {
            self.wake_owed = false;
            self.wake_sender();
        }
    }

    /// Takes `n` items' room out of the count, unless they were reserved (their room was
    /// given back then).
    fn release_unreserved(&mut self, n: usize) {
        let reserved = n.min(self.reserved);
        self.reserved -= reserved;
        if n > reserved {
            self.release(n - reserved);
        }
    }

    /// The next item, in order.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        // Only after a `poll_pop` (a reader that mixes the two).
        self.settle();
        if !ready!(self.poll_filled(cx)) {
            return Poll::Ready(None);
        }
        let item = own(&mut self.buffer).pop_front();
        if item.is_some() {
            self.release_unreserved(1);
        }
        Poll::Ready(item)
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let (queue, waker) = {
            let mut state = lock(&self.shared.state);
            state.rx_closed = true;
            // Release pairs with the Acquire in `Sender::receiver_gone`.
            self.shared.rx_gone.store(true, Ordering::Release);
            // Nobody waits for items any more: no early pushes for a reader that is gone.
            self.shared.rx_parked.store(false, Ordering::Relaxed);
            (mem::take(&mut state.queue), state.tx_waker.take())
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        // The items left are dropped here, outside the lock (their `Drop` is user code).
        drop(queue);
    }
}

// Nothing in either side is ever pinned (the items sit in heap deques, moved in and out by
// value): both are `Unpin` whatever `T` is, as a `VecDeque<T>` is only when `T: Unpin`.
impl<T> Unpin for Sender<T> {}
impl<T> Unpin for Receiver<T> {}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").field("len", &self.len()).finish()
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(all(test, taskweave_loom))]
mod loom_models;

#[cfg(all(test, not(taskweave_loom)))]
mod tests {
    use std::collections::VecDeque;
    use std::task::{Context, Poll, Waker};

    use super::bounded;

    /// A reader that reserves gives back the room of what it reserved at once, and reading a
    /// reserved item with `poll_next` does not give it back twice.
    #[test]
    fn reserved_items_leave_the_count_once_whichever_way_they_are_read() {
        let mut cx = Context::from_waker(Waker::noop());
        let (tx, mut rx) = bounded::<u32>(8);
        assert!(tx.push(&mut VecDeque::from([0, 1, 2, 3, 4, 5])).is_ok());
        assert_eq!(tx.room(), 2);
        // Three reserved (at most three wanted), the first handed out.
        assert_eq!(rx.poll_pop(&mut cx, 3), Poll::Ready(Some(0)));
        assert_eq!(tx.room(), 5, "the three reserved left the count at once");
        assert_eq!(rx.len(), 5, "two reserved and three others still wait");
        // A reserved item read by `poll_next`: no second release.
        assert_eq!(rx.poll_next(&mut cx), Poll::Ready(Some(1)));
        assert_eq!(tx.room(), 5);
        // The last reserved one, then two that were not: only those two leave the count.
        for (item, room) in [(2, 5), (3, 6), (4, 7)] {
            assert_eq!(rx.poll_next(&mut cx), Poll::Ready(Some(item)));
            assert_eq!(tx.room(), room);
        }
        // The last one, popped on its own; then the close.
        assert_eq!(rx.poll_pop(&mut cx, 4), Poll::Ready(Some(5)));
        assert_eq!(tx.room(), 8);
        assert_eq!(rx.len(), 0);
        drop(tx);
        assert_eq!(rx.poll_pop(&mut cx, 4), Poll::Ready(None));
    }

    /// With nothing ready, a reserving pop waits; after the next push it is ready.
    #[test]
    fn a_reserving_pop_with_nothing_ready_waits() {
        let mut cx = Context::from_waker(Waker::noop());
        let (tx, mut rx) = bounded::<u32>(2);
        assert_eq!(rx.poll_pop(&mut cx, 2), Poll::Pending);
        assert!(tx.push(&mut VecDeque::from([7])).is_ok());
        assert_eq!(rx.poll_pop(&mut cx, 2), Poll::Ready(Some(7)));
        assert_eq!(tx.room(), 2);
    }
}
