//! `fan_out`: n copies of a stage reading one shared input, their outputs merged.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::FusedStream;
use taskweave_supervise::internal::{Next, SharedInput};
use taskweave_supervise::{TaskName, TokenWatch, catch_panic};
use tokio_util::sync::{CancellationToken, DropGuard};

/// The most copies of a stage [`fan_out`] runs: 65,536. Each copy is a task, and the output
/// channel (allocated up front) holds two items per copy, so a count near `usize::MAX` would
/// be an allocation failure (an abort), not a fan-out.
pub const MAX_WORKERS: usize = 1 << 16;

/// Runs `workers` copies of `stage` over the items of `input`, each item processed exactly
/// once by whichever copy is free, and merges their outputs into one stream.
///
/// - **Order is not kept**: outputs come in completion order. When order matters, use an
///   ordered parallel map (`taskweave-group`'s `map_parallel`, or `taskweave-reorder`).
/// - `workers` tasks take turns reading `input` (each takes the next item under a lock, then
///   runs `stage` on it with the lock released) and send into a bounded output of
///   `2 × workers` items. A slow consumer slows the workers, which stop reading the input (backpressure end
///   to end).
/// - A panicking call is caught, logged with its backtrace and counted in
///   [`FanOut::panicked`]; its item produces no output, and the copy keeps serving. A panic
///   in the input stream is caught, logged and counted too, and ends the input for every
///   copy (the output ends after the items in flight).
/// - The tasks (spawned through `taskweave-supervise`) stop when `token` is cancelled, when
///   the input ends, or when the `FanOut` is dropped; the output ends when the last copy has
///   stopped.
///
/// # Examples
///
/// ```
/// use futures::StreamExt;
/// use taskweave_fan::fan_out;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let input = futures::stream::iter(1..=10_u64);
/// let mut squares: Vec<u64> = fan_out(CancellationToken::new(), input, 3, |n| async move { n * n })
///     .collect()
///     .await;
/// squares.sort_unstable(); // completion order, not input order
/// assert_eq!(squares, (1..=10).map(|n| n * n).collect::<Vec<_>>());
/// # }
/// ```
///
/// # Panics
///
/// Panics if `workers` is zero or above [`MAX_WORKERS`], or when called outside a tokio
/// runtime.
pub fn fan_out<S, F, Fut>(
    token: CancellationToken,
    input: S,
    workers: usize,
    stage: F,
) -> FanOut<Fut::Output>
where
    S: Stream + Send + 'static,
    S::Item: Send + 'static,
    F: Fn(S::Item) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    assert!(workers > 0, "fan_out: workers must be greater than zero");
    assert!(
        workers <= MAX_WORKERS,
        "fan_out: {workers} workers is more than MAX_WORKERS ({MAX_WORKERS})"
    );
    let token = token.child_token();
    let (out_tx, out_rx) = async_channel::bounded(workers.saturating_mul(2));
    let panicked = Arc::new(AtomicU64::new(0));
    // The copies take turns reading the input: no feeder task, no hop through a queue.
    let input = Arc::new(SharedInput::new(input));

    let stage = Arc::new(stage);
    for worker in 0..workers {
        let (input, out_tx) = (Arc::clone(&input), out_tx.clone());
        let (stage, panicked) = (Arc::clone(&stage), Arc::clone(&panicked));
        let watch = TokenWatch::new(&token);
        let name = TaskName::from(format!("fan-out-{worker}"));
        drop(taskweave_supervise::spawn(name.clone(), async move {
            loop {
                let item = {
                    let Some(mut turn) = input.turn(&watch).await else {
                        return;
                    };
                    match turn.next(&watch, "fan-out-input").await {
                        Next::Item(_, item) => item,
                        Next::Ended | Next::Cancelled => return,
                        Next::Panicked(..) => {
                            // The input is broken (the panic is logged): it ends here for
                            // every copy, and the panic is counted.
                            panicked.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    }
                };
                // One unit of tokio's cooperative budget per item (neither the lock nor
                // async-channel takes any), so that a copy on an always-ready input lets the
                // other tasks of its thread run.
                tokio::task::coop::consume_budget().await;
                // The stage is called inside the caught future: a panic in the closure
                // itself is caught too (and logged there with the copy's name).
                let call = catch_panic(name.clone(), async { stage(item).await });
                let Some(result) = watch.run_until_cancelled(call).await else {
                    return;
                };
                match result {
                    Ok(output) => {
                        // The consumer is gone, or the token cancelled: stop.
                        let sent = watch.run_until_cancelled(out_tx.send(output)).await;
                        if !matches!(sent, Some(Ok(()))) {
                            return;
                        }
                    }
                    Err(_panic) => {
                        // Relaxed: an independent counter.
                        panicked.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    FanOut {
        output: Box::pin(out_rx),
        panicked,
        _stop_on_drop: token.drop_guard(),
    }
}

/// The merged outputs of [`fan_out`].
///
/// `size_hint`: the results already waiting as the lower bound, no upper bound (the workers
/// and the input decide); `(0, Some(0))` once it has ended.
#[must_use = "streams do nothing unless polled"]
pub struct FanOut<R> {
    // Boxed so that `FanOut` is `Unpin` (async-channel's receiver is not).
    output: Pin<Box<async_channel::Receiver<R>>>,
    panicked: Arc<AtomicU64>,
    // Dropping the `FanOut` cancels the copies.
    _stop_on_drop: DropGuard,
}

impl<R> FanOut<R> {
    /// Calls of the stage that panicked so far (their items produced no output), plus one if
    /// the input stream panicked (which ended it).
    #[must_use]
    pub fn panicked(&self) -> u64 {
        self.panicked.load(Ordering::Relaxed)
    }
}

impl<R> Stream for FanOut<R> {
    type Item = R;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<R>> {
        self.output.as_mut().poll_next(cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.output.is_terminated() {
            (0, Some(0))
        } else {
            (self.output.len(), None)
        }
    }
}

impl<R> FusedStream for FanOut<R> {
    fn is_terminated(&self) -> bool {
        self.output.is_terminated()
    }
}

impl<R> fmt::Debug for FanOut<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FanOut")
            .field("buffered", &self.output.len())
            .field("panicked", &self.panicked())
            .finish()
    }
}
