//! `Stage`: the output of a source or stage, the task behind it, and why it ended.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::FusedStream;
use pin_project_lite::pin_project;
use taskweave_supervise::{PanicError, TaskName, TokenWatch, catch_panic};
use tokio_util::sync::DropGuard;

use crate::Pipeline;

/// Why a stage's task finished.
///
/// Read it with [`Stage::end`] once the stage's output has ended.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum StageEnd {
    /// The input ended (for a source: it ran out of items) and every item was sent on.
    InputEnded,
    /// The token was cancelled, or the stage's output was dropped; the item or call in
    /// flight inside the stage was dropped. Items already in the output channel are still
    /// yielded before the stream ends.
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
struct Shared {
    name: TaskName,
    end: OnceLock<StageEnd>,
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

/// A source's or stage's output: a bounded channel owned by the stage's task.
///
/// - **Order**: the order in which the stage produced its items (for map, filter,
///   filter_map and try_map: the input's order).
/// - **Backpressure**: the channel holds [`Pipeline::capacity`] items; when it is full the
///   stage waits, and so stops reading its own input.
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
    // Boxed so that `Stage` is `Unpin` (async-channel's receiver is not).
    output: Pin<Box<async_channel::Receiver<T>>>,
    shared: Arc<Shared>,
    done: bool,
    // Dropping the `Stage` cancels its task.
    _stop_on_drop: DropGuard,
}

impl<T> Stage<T> {
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

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if self.done {
            return Poll::Ready(None);
        }
        let polled = self.output.as_mut().poll_next(cx);
        if let Poll::Ready(None) = polled {
            self.done = true;
            if let Some(panic) = self.shared.end.get().and_then(StageEnd::panic) {
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

/// How the loop of a stage stopped.
enum Stop {
    InputEnded(Option<PanicError>),
    Cancelled,
    ConsumerGone,
}

/// Spawns the task of one source or stage: it reads `input`, runs `step` on each item and
/// sends the `Some` results into a bounded channel it owns.
pub(crate) fn spawn_stage<S, F, Fut, O>(
    pipeline: &Pipeline,
    default_name: &'static str,
    input: S,
    step: F,
) -> Stage<O>
where
    S: Stream + Send + 'static,
    S::Item: Send,
    F: FnMut(S::Item) -> Fut + Send + 'static,
    Fut: Future<Output = Option<O>> + Send,
    O: Send + 'static,
{
    let name = pipeline
        .stage_name()
        .cloned()
        .unwrap_or_else(|| TaskName::from(default_name));
    let token = pipeline.token().child_token();
    let (tx, rx) = async_channel::bounded(pipeline.capacity());
    let shared = Arc::new(Shared {
        name: name.clone(),
        end: OnceLock::new(),
    });

    let task_shared = Arc::clone(&shared);
    let watch = TokenWatch::new(&token);
    let task = async move {
        let looped = catch_panic(name.clone(), run_loop(input, step, &tx, &watch)).await;
        let end = match looped {
            Err(panic) => StageEnd::Panicked(panic),
            Ok(Stop::InputEnded(Some(panic))) => {
                tracing::debug!(stage = %name, upstream = %panic.name(), "stage ended: a stage upstream panicked");
                StageEnd::UpstreamPanicked(panic)
            }
            Ok(Stop::InputEnded(None)) => StageEnd::InputEnded,
            Ok(Stop::Cancelled | Stop::ConsumerGone) => StageEnd::Cancelled,
        };
        tracing::debug!(stage = %name, ?end, "stage finished");
        let _ = task_shared.end.set(end);
        // Closes the output after `end` is set.
        drop(tx);
    };
    drop(taskweave_supervise::spawn(shared.name.clone(), task));
    Stage {
        output: Box::pin(rx),
        shared,
        done: false,
        _stop_on_drop: token.drop_guard(),
    }
}

async fn run_loop<S, F, Fut, O>(
    input: S,
    mut step: F,
    tx: &async_channel::Sender<O>,
    watch: &TokenWatch,
) -> Stop
where
    S: Stream,
    F: FnMut(S::Item) -> Fut,
    Fut: Future<Output = Option<O>>,
{
    let mut input = std::pin::pin!(WatchedInput {
        input,
        caught: None
    });
    loop {
        let item = match watch
            .run_until_cancelled(futures::StreamExt::next(&mut input))
            .await
        {
            None => return Stop::Cancelled,
            Some(None) => return Stop::InputEnded(input.as_mut().project().caught.take()),
            Some(Some(item)) => item,
        };
        // One unit of tokio's cooperative budget per item (async-channel takes none): a
        // stage whose input is always ready and whose output always has room (a filter that
        // keeps few items, a consumer on another thread) still lets other tasks run.
        tokio::task::coop::consume_budget().await;
        let output = match watch.run_until_cancelled(step(item)).await {
            None => return Stop::Cancelled,
            Some(None) => continue,
            Some(Some(output)) => output,
        };
        match watch.run_until_cancelled(tx.send(output)).await {
            None => return Stop::Cancelled,
            Some(Err(_)) => return Stop::ConsumerGone,
            Some(Ok(())) => {}
        }
    }
}

pin_project! {
    // A stage's input, polled with `LISTEN` set: a `Stage` inside it that ended because of
    // a panic leaves the panic in `caught`.
    struct WatchedInput<S> {
        #[pin]
        input: S,
        caught: Option<PanicError>,
    }
}

// Puts back the listening state of the poll around this one, also when the input panics.
struct Restore(u8);

impl Drop for Restore {
    fn drop(&mut self) {
        LISTEN.set(self.0);
    }
}

impl<S: Stream> Stream for WatchedInput<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = self.project();
        let restore = Restore(LISTEN.replace(LISTENING));
        let polled = this.input.poll_next(cx);
        if LISTEN.get() == HEARD
            && let Some(panic) = HEARD_PANIC.take()
        {
            this.caught.get_or_insert(panic);
        }
        drop(restore);
        polled
    }
}
