//! `fan_out`: n copies of a stage reading one shared input, their outputs merged.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::stream::FusedStream;
use futures::{Stream, StreamExt};
use taskweave_supervise::{TaskName, catch_panic};
use tokio_util::sync::{CancellationToken, DropGuard};

/// Runs `workers` copies of `stage` over the items of `input`, each item processed exactly
/// once by whichever copy is free, and merges their outputs into one stream.
///
/// - **Order is not kept**: outputs come in completion order. When order matters, use an
///   ordered parallel map (`taskweave-group`'s `map_parallel`, or `taskweave-reorder`).
/// - One feeder task reads `input` into a bounded MPMC queue (async-channel) of `workers`
///   items; `workers` tasks take from it, run `stage`, and send into a bounded output of
///   `workers` items. A slow consumer slows the workers, which slows the feeder, which stops
///   reading the input (backpressure end to end).
/// - A panicking call is caught, logged with its backtrace and counted in
///   [`FanOut::panicked`]; its item produces no output, and the copy keeps serving.
/// - The tasks (spawned through `taskweave-supervise`) stop when `token` is cancelled, when
///   the input ends and is drained, or when the `FanOut` is dropped; the output ends when the
///   last copy has stopped.
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
/// Panics if `workers` is zero, or when called outside a tokio runtime.
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
    let token = token.child_token();
    let (work_tx, work_rx) = async_channel::bounded(workers);
    let (out_tx, out_rx) = async_channel::bounded(workers);
    let panicked = Arc::new(AtomicU64::new(0));

    let feeder_token = token.clone();
    drop(taskweave_supervise::spawn("fan-out-feeder", async move {
        let mut input = std::pin::pin!(input);
        let mut cancelled = std::pin::pin!(feeder_token.cancelled());
        loop {
            let item = tokio::select! {
                biased;
                () = &mut cancelled => return,
                item = input.next() => item,
            };
            let Some(item) = item else {
                return;
            };
            // Fails only when every worker has stopped: nobody left to take it.
            if work_tx.send(item).await.is_err() {
                return;
            }
        }
    }));

    let stage = Arc::new(stage);
    for worker in 0..workers {
        let (work_rx, out_tx) = (work_rx.clone(), out_tx.clone());
        let (stage, panicked, token) = (Arc::clone(&stage), Arc::clone(&panicked), token.clone());
        let name = TaskName::from(format!("fan-out-{worker}"));
        drop(taskweave_supervise::spawn(name.clone(), async move {
            let mut cancelled = std::pin::pin!(token.cancelled());
            loop {
                let item = tokio::select! {
                    biased;
                    () = &mut cancelled => return,
                    item = work_rx.recv() => item,
                };
                // The input ended and the queue is drained.
                let Ok(item) = item else {
                    return;
                };
                // The stage is called inside the caught future: a panic in the closure
                // itself is caught too (and logged there with the copy's name).
                match catch_panic(name.clone(), async { stage(item).await }).await {
                    Ok(output) => {
                        // The consumer is gone: stop.
                        if out_tx.send(output).await.is_err() {
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
#[must_use = "streams do nothing unless polled"]
pub struct FanOut<R> {
    // Boxed so that `FanOut` is `Unpin` (async-channel's receiver is not).
    output: Pin<Box<async_channel::Receiver<R>>>,
    panicked: Arc<AtomicU64>,
    // Dropping the `FanOut` cancels the copies and the feeder.
    _stop_on_drop: DropGuard,
}

impl<R> FanOut<R> {
    /// Calls of the stage that panicked so far (their items produced no output).
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
