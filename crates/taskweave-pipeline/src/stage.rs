//! `Stage`: the output of a source or stage, the task behind it, and why it ended.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::FusedStream;
use taskweave_supervise::{PanicError, TaskName};
use tokio_util::sync::{CancellationToken, DropGuard};

use taskweave_supervise::internal::chan;

/// Why a stage's task finished.
///
/// Read it with [`Stage::end`] once the stage's output has ended.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum StageEnd {
    /// The input ended (for a source: it ran out of items) and every item was sent on.
    InputEnded,
    /// The token was cancelled, or the stage's output was dropped. The call in flight inside
    /// the stage was dropped, and so were the items it had taken from its input but not
    /// started (as the items still queued in its input are); the items it had finished are
    /// handed on, and items already in the output channel are still yielded before the
    /// stream ends.
    Cancelled,
    /// The stage's own function (or its source) panicked.
    Panicked(PanicError),
    /// The input ended early because a stage upstream panicked: a [`Stage`] read by this
    /// stage (directly or through adapters such as `StreamExt::map` or `chain`) ended with
    /// [`Panicked`](Self::Panicked) or `UpstreamPanicked`. [`PanicError::name`] names the
    /// stage that panicked.
    UpstreamPanicked(PanicError),
}

impl StageEnd {
    /// The panic that ended the stage, its own or one upstream.
    #[must_use]
    pub fn panic(&self) -> Option<&PanicError> {
        match self {
            StageEnd::Panicked(panic) | StageEnd::UpstreamPanicked(panic) => Some(panic),
            StageEnd::InputEnded | StageEnd::Cancelled => None,
        }
    }
}

// Shared between a stage's task and its `Stage`. The task sets `end` before it drops its
// sender; the receiver sees the channel close after that, so a finished stream always finds
// `end` set (unless the task was aborted, by a runtime shutting down).
pub(crate) struct Shared {
    pub(crate) name: TaskName,
    pub(crate) end: OnceLock<StageEnd>,
}

// How a stage learns that its input ended because of a panic upstream. While a stage polls
// its input, `LISTEN` is `LISTENING`; a `Stage` that ends inside that poll (the input itself,
// or one inside an adapter such as `map` or `chain`) because of a panic sets it to `HEARD`
// and leaves the panic in `HEARD_PANIC`. Scoped to the input's poll, so a `Stage` read
// elsewhere in the stage's task (inside its function) is not mistaken for its input. The hot
// path is two accesses to a `Cell<u8>`.
const NOT_LISTENING: u8 = 0;
const LISTENING: u8 = 1;
const HEARD: u8 = 2;

thread_local! {
    static LISTEN: Cell<u8> = const { Cell::new(NOT_LISTENING) };
    static HEARD_PANIC: RefCell<Option<PanicError>> = const { RefCell::new(None) };
}

/// Listening while it lives: a stage polls its input inside one. Dropping it puts back the
/// state of the poll around this one, also when the input panics.
pub(crate) struct Listening(u8);

impl Listening {
    #[inline]
    pub(crate) fn start() -> Self {
        Listening(LISTEN.replace(LISTENING))
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        LISTEN.set(self.0);
    }
}

/// The panic a `Stage` polled inside the current [`Listening`] ended with, if one did.
#[inline]
pub(crate) fn heard_panic() -> Option<PanicError> {
    if LISTEN.get() == HEARD {
        LISTEN.set(LISTENING);
        HEARD_PANIC.take()
    } else {
        None
    }
}

/// A source's or stage's output: a bounded channel owned by the stage's task.
///
/// - **Order**: the order in which the stage produced its items (for map, filter,
///   filter_map and try_map: the input's order).
/// - **Backpressure**: the channel holds [`Pipeline::capacity`](crate::Pipeline::capacity) items, counting those the
///   consumer's `Stage` already moved into its own buffer and has not yielded; when it is
///   full the stage waits, and so stops reading its own input. Each item yielded gives its
///   room back at once.
/// - **Hand-off in batches**: the stage takes every item its input has ready (up to the
///   room in its output), runs its function on each in turn and hands the results on in
///   one push; the `Stage` takes everything queued in one go. Nothing waits to fill a batch:
///   one item at a time goes straight through, a call that has to wait first hands on the
///   items finished before it, and while the reader waits each item is handed on as soon
///   as it is finished (with any finished before the reader began to wait: a step that
///   runs long without waiting holds back only the items finished before it in its turn).
/// - **End**: the stream ends once the stage's task has recorded why it stopped (see
///   [`end`](Self::end)) and closed the channel, and every item already in the channel was
///   taken: after the input ended, the token was cancelled, or a stage panicked. After a
///   cancel, the items already in the channel are still yielded.
/// - **Drop**: dropping a `Stage` cancels its task, which drops its input (and so, when that
///   input is or contains a `Stage`, stops the stages upstream too).
///
/// `Stage` is `Unpin`, and `Send` and `Sync` when `T: Send`.
///
/// `size_hint`: the items already waiting in the stage's output as the lower bound; exactly
/// those once the stage's task has closed its output; `(0, Some(0))` once it has ended.
///
/// # Cancel safety
///
/// Reading with `StreamExt::next` is cancel safe: dropping the `next()` future (in a
/// `select!` branch that lost) loses no item.
///
/// # Examples
///
/// ```
/// use futures::StreamExt;
/// use taskweave_pipeline::{Pipeline, StageEnd};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let pipeline = Pipeline::new(CancellationToken::new());
/// let mut numbers = pipeline.iter([1, 2, 3]);
/// let mut seen = Vec::new();
/// while let Some(n) = numbers.next().await {
///     seen.push(n);
/// }
/// assert_eq!(seen, [1, 2, 3]);
/// assert!(matches!(numbers.end(), Some(StageEnd::InputEnded)));
/// # }
/// ```
#[must_use = "streams do nothing unless polled"]
pub struct Stage<T> {
    output: chan::Receiver<T>,
    shared: Arc<Shared>,
    done: bool,
    // Dropping the `Stage` cancels its task.
    _stop_on_drop: DropGuard,
}

impl<T> Stage<T> {
    /// The output of a stage's task, which will set `end` before it drops the sender.
    pub(crate) fn new(output: chan::Receiver<T>, name: TaskName, token: CancellationToken) -> Self {
        Stage {
            output,
            shared: Arc::new(Shared {
                name,
                end: OnceLock::new(),
            }),
            done: false,
            _stop_on_drop: token.drop_guard(),
        }
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        Arc::clone(&self.shared)
    }

    /// What a stage reading this one directly takes: the next item, out of up to `max`
    /// reserved at once (their room given back in one read-modify-write; see
    /// `chan::Receiver::poll_pop`). `Ready(None)` once the output has ended.
    #[inline]
    pub(crate) fn poll_pop(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<Option<T>> {
        if self.done {
            return Poll::Ready(None);
        }
        let popped = self.output.poll_pop(cx, max);
        if let Poll::Ready(None) = popped {
            self.done = true;
        }
        popped
    }

    /// Wakes the stage's task if a large reservation owes it a wake-up
    /// (`chan::Receiver::settle`).
    #[inline]
    pub(crate) fn settle(&mut self) {
        self.output.settle();
    }

    /// The stage's name, used in its logs and in a [`PanicError`] it reports.
    #[must_use]
    pub fn name(&self) -> &TaskName {
        &self.shared.name
    }

    /// Why the stage's task stopped; `None` while it runs (or if it was aborted by a
    /// runtime shutting down). Items it sent before stopping may still be buffered.
    #[must_use]
    pub fn end(&self) -> Option<&StageEnd> {
        self.shared.end.get()
    }

    /// The items waiting in the stage's output channel.
    #[must_use]
    pub fn len(&self) -> usize {
        self.output.len()
    }

    /// `true` when no item waits in the stage's output channel.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.output.is_empty()
    }
}

impl<T> Stream for Stage<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let polled = this.output.poll_next(cx);
        if let Poll::Ready(None) = polled {
            this.done = true;
            if let Some(panic) = this.shared.end.get().and_then(StageEnd::panic) {
                // Read by a stage polling its input: that stage reports the panic as the
                // reason its input ended. Elsewhere the reader asks `end()` itself.
                if LISTEN.get() != NOT_LISTENING {
                    LISTEN.set(HEARD);
                    HEARD_PANIC.set(Some(panic.clone()));
                }
            }
        }
        polled
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            (0, Some(0))
        } else if self.output.is_closed() {
            (self.output.len(), Some(self.output.len()))
        } else {
            (self.output.len(), None)
        }
    }
}

// The items are never pinned: the channel moves them in and out by value.
impl<T> Unpin for Stage<T> {}

impl<T> FusedStream for Stage<T> {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl<T> fmt::Debug for Stage<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stage")
            .field("name", &self.shared.name)
            .field("buffered", &self.output.len())
            .field("end", &self.shared.end.get())
            .finish()
    }
}
