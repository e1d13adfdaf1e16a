//! Pieces the other taskweave crates share, kept here because every one of them depends on
//! this crate. Hidden from the docs and not part of the semver promise: use them from outside
//! taskweave at your own risk.

use std::pin::Pin;
use std::sync::{Mutex, MutexGuard, PoisonError};

use futures::{Stream, StreamExt};

use crate::{PanicError, TokenWatch, catch_panic};

pub mod chan;

/// Drops a user value on one of our tasks: a panic of its `Drop` is caught and logged
/// (with `name`), instead of taking the task down.
pub fn drop_caught<T>(name: &crate::TaskName, value: T) {
    crate::catch::drop_caught(name, value);
}

/// Calls user code `f` with a user value we own. If `f` panics, `value` is dropped first
/// in a catch of its own ([`drop_caught`]: dropped during that unwind, a `Drop` that panics
/// too would abort the process), then the panic goes on.
pub fn call_with<T, R>(name: &crate::TaskName, value: T, f: impl FnOnce(&T) -> R) -> (T, R) {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&value))) {
        Ok(result) => (value, result),
        Err(payload) => {
            drop_caught(name, value);
            std::panic::resume_unwind(payload)
        }
    }
}

/// The buffer of a stage or an output when the caller names none (the pipeline's stages, the
/// tee's outputs).
pub const DEFAULT_CAPACITY: usize = 32;

/// Locks `mutex`, ignoring poisoning.
///
/// For the locks of our books (counters, queues, option slots) under which no user code runs:
/// a panic elsewhere on the thread cannot have left them half-changed, so a poisoned lock
/// still guards consistent data, and refusing it would turn one caught panic into many.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One input that several worker tasks take turns reading: whoever holds the lock takes the
/// next item, so no feeder task and no hop through a queue sit between the input and the
/// workers (`fan_out`, `map_ordered`). The input's `poll_next` is user code: a panic there
/// is caught, and ends the input for every worker.
pub struct SharedInput<S> {
    state: futures::lock::Mutex<InputState<S>>,
}

struct InputState<S> {
    stream: Pin<Box<S>>,
    /// Items handed out so far: the index of the next one.
    taken: u64,
    ended: bool,
}

/// A worker's turn at a [`SharedInput`]: the others wait until it is dropped.
pub struct Turn<'a, S> {
    state: futures::lock::MutexGuard<'a, InputState<S>>,
}

/// What a [`Turn::next`] found.
#[derive(Debug)]
pub enum Next<T> {
    /// The next item, with its index (its place in the input, from 0).
    Item(u64, T),
    /// The input has ended (now or before): nothing more for anyone.
    Ended,
    /// The input panicked while producing the item at this index; it is ended for everyone.
    Panicked(u64, PanicError),
    /// The watch's token was cancelled first.
    Cancelled,
}

impl<S: Stream> SharedInput<S> {
    /// Shares `stream`.
    pub fn new(stream: S) -> Self {
        SharedInput {
            state: futures::lock::Mutex::new(InputState {
                stream: Box::pin(stream),
                taken: 0,
                ended: false,
            }),
        }
    }

    /// Waits for this worker's turn; `None` when the watch's token is cancelled first or the
    /// input has ended.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future takes no turn. Whether a dropped wait that had been woken hands
    /// that wake-up on to the next waiter is futures-util's code, not its documentation, so
    /// the callers here drop it only when the watch's token is cancelled, when every worker
    /// of the input stops anyway.
    pub async fn turn(&self, watch: &TokenWatch) -> Option<Turn<'_, S>> {
        let state = watch.run_until_cancelled(self.state.lock()).await?;
        (!state.ended).then_some(Turn { state })
    }
}

impl<S: Stream> Turn<'_, S> {
    /// The index the next item will have.
    pub fn next_index(&self) -> u64 {
        self.state.taken
    }

    /// Takes the next item, unless the watch's token is cancelled first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: `StreamExt::next` loses no item when dropped, and the count of items
    /// taken moves only when one is handed out.
    pub async fn next(&mut self, watch: &TokenWatch, name: &'static str) -> Next<S::Item> {
        let index = self.state.taken;
        let next = catch_panic(name, self.state.stream.next());
        match watch.run_until_cancelled(next).await {
            None => Next::Cancelled,
            Some(Ok(Some(item))) => {
                self.state.taken += 1;
                Next::Item(index, item)
            }
            Some(Ok(None)) => {
                self.state.ended = true;
                Next::Ended
            }
            Some(Err(panic)) => {
                self.state.ended = true;
                Next::Panicked(index, panic)
            }
        }
    }
}

impl<S> std::fmt::Debug for SharedInput<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedInput").finish_non_exhaustive()
    }
}

impl<S> std::fmt::Debug for Turn<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn")
            .field("next_index", &self.state.taken)
            .field("ended", &self.state.ended)
            .finish_non_exhaustive()
    }
}
