//! `reorder_channel`: producers push `(index, value)`, held back while the index is beyond
//! the window; the receiver yields values in index order.

use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::FusedStream;
use futures::task::AtomicWaker;
use tokio::sync::Notify;

use crate::{MissingIndices, PushError, ReorderBuffer};

/// A reorder buffer between tasks: any number of producers [`send`](ReorderSender::send)
/// `(index, value)` in any order, and one [`ReorderReceiver`] yields the values in index order
/// (indices from 0).
///
/// This is where the window's backpressure belongs: a `send` whose index is at or beyond
/// `next + window` waits (the producer is held back) until the receiver has taken enough
/// values for it to fit. The index the receiver waits for always fits, so a producer that
/// has it is never held back. When every sender left is held back, nobody can send the
/// index in front any more: the receiver then yields an `Err(MissingIndices)` for the
/// indices it steps over (as few as needed for the lowest held-back index to fit, stopping
/// at the first value that arrived) and goes on, and the held-back senders go through. So
/// the channel cannot deadlock: it waits only while some sender that is not held back
/// could still send the missing index. A skipped index sent later is refused with
/// [`SendError::Duplicate`]. That count is of sender handles, which is why
/// [`send`](ReorderSender::send) takes `&mut self`: a handle has at most one send in flight,
/// so a handle whose send is held back can send nothing else (clone the sender for each
/// producer that sends concurrently).
///
/// # Examples
///
/// ```
/// use futures::StreamExt;
/// use taskweave_reorder::reorder_channel;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (tx, rx) = reorder_channel(2);
/// for index in [2_u64, 0, 1] {
///     let mut tx = tx.clone();
///     // Index 2 waits until index 0 is taken out: the window holds 2 entries.
///     tokio::spawn(async move { tx.send(index, index * 10).await.unwrap() });
/// }
/// drop(tx);
/// let values: Vec<u64> = rx.map(Result::unwrap).collect().await;
/// assert_eq!(values, [0, 10, 20]);
/// # }
/// ```
///
/// # Panics
///
/// Panics if `window` is zero.
pub fn reorder_channel<T>(window: usize) -> (ReorderSender<T>, ReorderReceiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            buffer: ReorderBuffer::new(window),
            senders: 1,
            held_back: BTreeMap::new(),
            held_count: 0,
            receiver_alive: true,
            gaps_reported: false,
        }),
        moved_on: Notify::new(),
        receiver: AtomicWaker::new(),
    });
    (
        ReorderSender {
            shared: Arc::clone(&shared),
        },
        ReorderReceiver {
            shared,
            done: false,
        },
    )
}

struct Shared<T> {
    state: Mutex<State<T>>,
    // Notified when the window moves on (or the receiver is gone): held-back senders retry.
    moved_on: Notify,
    receiver: AtomicWaker,
}

struct State<T> {
    buffer: ReorderBuffer<T>,
    senders: usize,
    /// The indices of the sends held back beyond the window, with how many wait on each.
    held_back: BTreeMap<u64, usize>,
    /// How many sends are held back: when it equals `senders`, nobody can fill the gap in
    /// front any more, and the receiver steps over it.
    held_count: usize,
    receiver_alive: bool,
    gaps_reported: bool,
}

impl<T> State<T> {
    /// `true` when every sender left is held back beyond the window: the index the receiver
    /// waits for can no longer come.
    fn stalled(&self) -> bool {
        self.senders > 0 && self.held_count == self.senders
    }

    fn hold(&mut self, index: u64) {
        *self.held_back.entry(index).or_insert(0) += 1;
        self.held_count += 1;
    }

    fn release(&mut self, index: u64) {
        if let Some(count) = self.held_back.get_mut(&index) {
            *count -= 1;
            if *count == 0 {
                self.held_back.remove(&index);
            }
            self.held_count -= 1;
        }
    }
}

/// A send's registration as held back; dropping it (the send finished or its future was
/// dropped) takes the registration out.
struct Hold<'a, T> {
    shared: &'a Shared<T>,
    index: u64,
    held: bool,
}

impl<T> Hold<'_, T> {
    /// Takes the registration out under a lock the caller already holds.
    fn release(&mut self, state: &mut State<T>) {
        if std::mem::take(&mut self.held) {
            state.release(self.index);
        }
    }
}

impl<T> Drop for Hold<'_, T> {
    fn drop(&mut self) {
        if self.held {
            self.shared.lock().release(self.index);
        }
    }
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Every update is complete before the lock is released: poisoning is harmless.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Why [`ReorderSender::send`] gave a value back.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendError<T> {
    /// The index was sent before, or the receiver already stepped over it (every other
    /// sender was held back, or it was skipped).
    Duplicate {
        /// The index sent twice.
        index: u64,
        /// The refused value.
        value: T,
    },
    /// The receiver was dropped.
    Closed(T),
}

impl<T> SendError<T> {
    /// The value that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            SendError::Duplicate { value, .. } | SendError::Closed(value) => value,
        }
    }
}

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Duplicate { index, .. } => f
                .debug_struct("Duplicate")
                .field("index", index)
                .finish_non_exhaustive(),
            SendError::Closed(_) => f.write_str("Closed(..)"),
        }
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Duplicate { index, .. } => write!(f, "index {index} was sent already"),
            SendError::Closed(_) => f.write_str("the reorder receiver is gone"),
        }
    }
}

impl<T> std::error::Error for SendError<T> {}

/// The sending half of a [`reorder_channel`]; clone it for each producer.
pub struct ReorderSender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> ReorderSender<T> {
    /// Sends `value` at `index`, waiting while `index` is beyond the window.
    ///
    /// Takes `&mut self`: one send in flight per handle, so that the receiver can tell when
    /// every handle left is held back (see [`reorder_channel`]). Clone the sender for each
    /// producer that sends concurrently.
    ///
    /// # Errors
    ///
    /// [`SendError::Duplicate`] when `index` was sent before; [`SendError::Closed`] when the
    /// receiver was dropped (also while waiting). The value comes back in both.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe for the value: dropping the future while it waits drops `value`, and
    /// its index then stays missing.
    pub async fn send(&mut self, index: u64, value: T) -> Result<(), SendError<T>> {
        let mut value = value;
        let mut hold = Hold {
            shared: &self.shared,
            index,
            held: false,
        };
        loop {
            // Registered before the attempt: a move of the window in between is not missed.
            let moved_on = self.shared.moved_on.notified();
            let mut moved_on = std::pin::pin!(moved_on);
            moved_on.as_mut().enable();
            {
                let mut state = self.shared.lock();
                if !state.receiver_alive {
                    hold.release(&mut state);
                    return Err(SendError::Closed(value));
                }
                match state.buffer.push(index, value) {
                    Ok(()) => {
                        hold.release(&mut state);
                        drop(state);
                        self.shared.receiver.wake();
                        return Ok(());
                    }
                    Err(PushError::Duplicate { index, value }) => {
                        hold.release(&mut state);
                        return Err(SendError::Duplicate { index, value });
                    }
                    Err(PushError::BeyondWindow { value: back, .. }) => {
                        value = back;
                        if !hold.held {
                            hold.held = true;
                            state.hold(index);
                            if state.stalled() {
                                // Every sender is held back now: the receiver steps over
                                // the gap in front.
                                drop(state);
                                self.shared.receiver.wake();
                            }
                        }
                    }
                }
            }
            moved_on.await;
        }
    }
}

impl<T> Clone for ReorderSender<T> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        ReorderSender {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> Drop for ReorderSender<T> {
    fn drop(&mut self) {
        let wake = {
            let mut state = self.shared.lock();
            state.senders -= 1;
            state.senders == 0 || state.stalled()
        };
        if wake {
            self.shared.receiver.wake();
        }
    }
}

impl<T> fmt::Debug for ReorderSender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("ReorderSender")
            .field("buffer", &state.buffer)
            .field("senders", &state.senders)
            .finish()
    }
}

/// The receiving half of a [`reorder_channel`]: a stream of the values in index order.
///
/// - Yields `Ok(value)` as soon as the next index has arrived.
/// - When every sender left is held back beyond the window, yields an `Err(MissingIndices)`
///   for the indices it steps over so that the lowest held-back index fits, then goes on.
/// - When every sender is gone with gaps left, yields one `Err(MissingIndices)` listing them,
///   then the values buffered after the gaps, in order; then it ends.
/// - Dropping it makes every `send` fail with [`SendError::Closed`].
///
/// `size_hint`: `(0, None)`: values may be waiting for a gap to fill, and the senders decide
/// how many more come.
///
/// # Cancel safety
///
/// Reading with `StreamExt::next` is cancel safe: a dropped `next()` loses no value.
#[must_use = "streams do nothing unless polled"]
pub struct ReorderReceiver<T> {
    shared: Arc<Shared<T>>,
    done: bool,
}

impl<T> ReorderReceiver<T> {
    /// Values waiting for an earlier index.
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.shared.lock().buffer.len()
    }

    /// The index the receiver waits for.
    #[must_use]
    pub fn next_index(&self) -> u64 {
        self.shared.lock().buffer.next_index()
    }
}

impl<T> Stream for ReorderReceiver<T> {
    type Item = Result<T, MissingIndices>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let shared = Arc::clone(&self.shared);
        // Registered before looking: a push after the look wakes us.
        shared.receiver.register(cx.waker());
        let mut state = shared.lock();
        if let Some(value) = state.buffer.pop() {
            drop(state);
            shared.moved_on.notify_waiters();
            return Poll::Ready(Some(Ok(value)));
        }
        if state.senders > 0 {
            if !state.stalled() {
                return Poll::Pending;
            }
            // Every sender left waits beyond the window: the indices in front can no longer
            // come. Step over them until the lowest held-back index fits, and say so. A send
            // held back at an index the window has passed since (another handle sent that
            // index) fails as a duplicate when it retries: it does not count.
            let next = state.buffer.next_index();
            let lowest = state
                .held_back
                .range(next..)
                .next()
                .map(|(&index, _)| index);
            let skipped = lowest.and_then(|lowest| state.buffer.skip_until_fits(lowest));
            drop(state);
            let Some(missing) = skipped else {
                return Poll::Pending;
            };
            shared.moved_on.notify_waiters();
            return Poll::Ready(Some(Err(missing)));
        }
        // No sender left, so nobody waits for the window to move.
        let State {
            buffer,
            gaps_reported,
            ..
        } = &mut *state;
        let next = buffer.next_after_end(gaps_reported);
        drop(state);
        self.done = next.is_none();
        Poll::Ready(next)
    }
}

impl<T> FusedStream for ReorderReceiver<T> {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl<T> Drop for ReorderReceiver<T> {
    fn drop(&mut self) {
        self.shared.lock().receiver_alive = false;
        self.shared.moved_on.notify_waiters();
    }
}

impl<T> fmt::Debug for ReorderReceiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("ReorderReceiver")
            .field("buffer", &state.buffer)
            .field("senders", &state.senders)
            .field("done", &self.done)
            .finish()
    }
}
