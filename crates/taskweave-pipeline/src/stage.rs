//! `Stage`: the output of a source or stage, the task behind it, and why it ended.

use std::cell::OnceCell;
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
    /// The token was cancelled; the items in flight inside the stage were dropped.
    Cancelled,
    /// The stage's function panicked, or a stage upstream of it did and the input ended
    /// early because of it; [`PanicError::name`] names the stage that panicked.
    Panicked(PanicError),
}

impl StageEnd {
    /// The panic that ended the stage, if one did.
    #[must_use]
    pub fn panic(&self) -> Option<&PanicError> {
        match self {
            StageEnd::Panicked(panic) => Some(panic),
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

tokio::task_local! {
    // Set in every stage's task: a `Stage` polled (directly or through adapters) by that
    // task writes here the panic that ended it, so that the reading stage reports it too.
    static UPSTREAM_PANIC: OnceCell<PanicError>;
}

/// A source's or stage's output: a bounded channel owned by the stage's task.
///
/// - **Order**: the order in which the stage produced its items (for map, filter,
///   filter_map and try_map: the input's order).
/// - **Backpressure**: the channel holds [`Pipeline::capacity`] items; when it is full the
///   stage waits, and so stops reading its own input.
/// - **End**: the stream ends after the stage's task has finished and every buffered item
///   was taken: when the input ended, the token was cancelled, or a stage panicked.
///   [`end`](Self::end) says which.
/// - **Drop**: dropping a `Stage` cancels its task (and so, through the input it owned,
///   every stage upstream of it that nobody else reads).
///
/// `Stage` is `Unpin`, and `Send` and `Sync` when `T: Send`.
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
    // Dropping the `Stage` cancels its task.
    _stop_on_drop: DropGuard,
}

impl<T> Stage<T> {
    /// The stage's name, used in its logs and in a [`PanicError`] it reports.
    #[must_use]
    pub fn name(&self) -> &TaskName {
        &self.shared.name
    }

    /// Why the stage's task finished; `None` while it runs (or if it was aborted by a
    /// runtime shutting down). Items it sent before finishing may still be buffered.
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
        let polled = self.output.as_mut().poll_next(cx);
        if let Poll::Ready(None) = polled
            && let Some(StageEnd::Panicked(panic)) = self.shared.end.get()
        {
            // Read by a stage's task: that stage reports the panic as its own end too.
            // Outside a stage (`try_with` fails) the reader asks `end()` itself.
            let _ = UPSTREAM_PANIC.try_with(|upstream| {
                let _ = upstream.set(panic.clone());
            });
        }
        polled
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.output.is_terminated() {
            (0, Some(0))
        } else {
            (self.output.len(), None)
        }
    }
}

impl<T> FusedStream for Stage<T> {
    fn is_terminated(&self) -> bool {
        self.output.is_terminated()
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
    InputEnded,
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
        let upstream = UPSTREAM_PANIC.with(|upstream| upstream.get().cloned());
        let end = match (looped, upstream) {
            (Err(panic), _) => StageEnd::Panicked(panic),
            (Ok(Stop::InputEnded), Some(panic)) => {
                tracing::debug!(stage = %name, upstream = %panic.name(), "stage ended: a stage upstream panicked");
                StageEnd::Panicked(panic)
            }
            (Ok(Stop::InputEnded), None) => StageEnd::InputEnded,
            (Ok(Stop::Cancelled | Stop::ConsumerGone), _) => StageEnd::Cancelled,
        };
        tracing::debug!(stage = %name, ?end, "stage finished");
        let _ = task_shared.end.set(end);
        // Closes the output after `end` is set.
        drop(tx);
    };
    drop(taskweave_supervise::spawn(
        shared.name.clone(),
        UPSTREAM_PANIC.scope(OnceCell::new(), task),
    ));
    Stage {
        output: Box::pin(rx),
        shared,
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
    let mut input = std::pin::pin!(input);
    loop {
        let item = match (OrCancelled {
            watch,
            future: futures::StreamExt::next(&mut input),
        })
        .await
        {
            None => return Stop::Cancelled,
            Some(None) => return Stop::InputEnded,
            Some(Some(item)) => item,
        };
        let output = match (OrCancelled {
            watch,
            future: step(item),
        })
        .await
        {
            None => return Stop::Cancelled,
            Some(None) => continue,
            Some(Some(output)) => output,
        };
        match (OrCancelled {
            watch,
            future: tx.send(output),
        })
        .await
        {
            None => return Stop::Cancelled,
            Some(Err(_)) => return Stop::ConsumerGone,
            Some(Ok(())) => {}
        }
    }
}

pin_project! {
    // `future`, or `None` as soon as the watched token is cancelled. Checking the token
    // costs one atomic load per poll (a `select!` on `token.cancelled()` takes its lock).
    struct OrCancelled<'a, F> {
        watch: &'a TokenWatch,
        #[pin]
        future: F,
    }
}

impl<F: Future> Future for OrCancelled<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if this.watch.is_cancelled() {
            return Poll::Ready(None);
        }
        match this.future.poll(cx) {
            Poll::Ready(output) => Poll::Ready(Some(output)),
            Poll::Pending => {
                this.watch.register(cx.waker());
                // A cancellation between the check and the registration woke nobody.
                if this.watch.is_cancelled() {
                    Poll::Ready(None)
                } else {
                    Poll::Pending
                }
            }
        }
    }
}
