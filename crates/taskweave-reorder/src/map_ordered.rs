//! `map_ordered`: a parallel map on spawned tasks whose results come out in input order.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::FusedStream;
use taskweave_supervise::internal::{Next, SharedInput};
use taskweave_supervise::{PanicError, TaskName, TokenWatch, catch_panic};
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::ReorderBuffer;

type Indexed<R> = (u64, Result<R, PanicError>);

/// The window between the workers and the consumer: index `i` may be taken once
/// `i < released + window`, where `released` counts the results the consumer has yielded.
struct Gate {
    released: AtomicU64,
    waiting: AtomicBool,
    moved: Notify,
    window: u64,
}

impl Gate {
    /// Waits until `index` fits the window.
    async fn fits(&self, index: u64) {
        loop {
            if index < self.released.load(Ordering::Acquire) + self.window {
                return;
            }
            let moved = self.moved.notified();
            let mut moved = std::pin::pin!(moved);
            moved.as_mut().enable();
            // SeqCst store then load, paired with the consumer's SeqCst store then load in
            // `release`: either this sees the new count, or the consumer sees this flag.
            self.waiting.store(true, Ordering::SeqCst);
            if index < self.released.load(Ordering::SeqCst) + self.window {
                return;
            }
            moved.await;
        }
    }

    /// Called by the consumer (the only writer of `released`) for `count` more yielded
    /// results.
    fn release(&self, count: usize) {
        let released = self.released.load(Ordering::Relaxed) + count as u64;
        self.released.store(released, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) && self.waiting.swap(false, Ordering::SeqCst) {
            self.moved.notify_waiters();
        }
    }
}

/// The most calls [`map_ordered`] runs at once: 65,536. Each is a worker task, and the
/// results channel (allocated up front) holds two results per call, so a concurrency near
/// `usize::MAX` would be an allocation failure (an abort), not a map.
pub const MAX_CONCURRENCY: usize = 1 << 16;

/// Maps `input` through `f` with up to `concurrency` calls in flight on spawned tasks, and
/// yields the results in input order.
///
/// - **Order**: result `k` is yielded after results `0..k`, whatever order the calls finish
///   in.
/// - **Runs ahead of the consumer**: the calls run on `concurrency` worker tasks (fewer when
///   the input's `size_hint` promises fewer items: no worker is spawned that could never get
///   one), not inside the consumer's poll. A consumer that awaits something else in its loop does not stall
///   them (futures' `buffered(n)` only makes progress while it is polled). At most
///   `2 × concurrency` items are between the input and the consumer (running, or finished and
///   waiting for an earlier one): a slow item holds the others back by at most that many,
///   and the input is not read further until the window moves on.
/// - **Panics**: a panic in `f` (or in the input stream) is caught, logged, and yielded as
///   `Err(PanicError)` at its item's place; the output goes on (after an input panic, it
///   ends there).
/// - **Stops** when `token` is cancelled (the output ends at once, calls in flight are
///   dropped), when the output is dropped, or after the input ended and every result was
///   yielded. Tasks are spawned through `taskweave-supervise`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use futures::StreamExt;
/// use taskweave_reorder::map_ordered;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let input = futures::stream::iter(1..=5_u64);
/// let out: Vec<u64> = map_ordered(CancellationToken::new(), input, 3, |n| async move {
///     // Later items finish first.
///     tokio::time::sleep(Duration::from_millis(100 - n * 10)).await;
///     n * 10
/// })
/// .map(Result::unwrap)
/// .collect()
/// .await;
/// assert_eq!(out, [10, 20, 30, 40, 50]);
/// # }
/// ```
///
/// # Panics
///
/// Panics if `concurrency` is zero or above [`MAX_CONCURRENCY`], or when called outside a
/// tokio runtime.
pub fn map_ordered<S, F, Fut>(
    token: CancellationToken,
    input: S,
    concurrency: usize,
    f: F,
) -> MapOrdered<Fut::Output>
where
    S: Stream + Send + 'static,
    S::Item: Send + 'static,
    F: Fn(S::Item) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    assert!(
        concurrency > 0,
        "map_ordered: concurrency must be greater than zero"
    );
    assert!(
        concurrency <= MAX_CONCURRENCY,
        "map_ordered: concurrency {concurrency} is above MAX_CONCURRENCY ({MAX_CONCURRENCY})"
    );
    let window = concurrency.saturating_mul(2);
    let token = token.child_token();
    let gate = Arc::new(Gate {
        released: AtomicU64::new(0),
        waiting: AtomicBool::new(false),
        moved: Notify::new(),
        window: window as u64,
    });
    // Never full: at most `window` items are between the input and the consumer.
    let (done_tx, done_rx) = async_channel::bounded::<Indexed<Fut::Output>>(window);
    // No more workers than the input says it has items: each costs a spawn and a token watch.
    // A stream that yields more than its upper bound still has every item mapped, by fewer
    // workers.
    let workers = match input.size_hint() {
        (_, Some(upper)) => concurrency.min(upper.max(1)),
        (_, None) => concurrency,
    };
    // The workers take turns reading the input: no feeder task, no hop through a queue.
    let input = Arc::new(SharedInput::new(input));
    let f = Arc::new(f);
    for worker in 0..workers {
        let (input, gate, done_tx, f) = (
            Arc::clone(&input),
            Arc::clone(&gate),
            done_tx.clone(),
            Arc::clone(&f),
        );
        let watch = TokenWatch::new(&token);
        let name = TaskName::from(format!("map-ordered-{worker}"));
        drop(taskweave_supervise::spawn(name.clone(), async move {
            loop {
                let Some(mut turn) = input.turn(&watch).await else {
                    return;
                };
                // The window: the next index is taken only once it fits the consumer's
                // buffer. Waiting with the input's lock held costs nothing: no other worker
                // could take an index either.
                if watch
                    .run_until_cancelled(gate.fits(turn.next_index()))
                    .await
                    .is_none()
                {
                    return;
                }
                let (index, item) = match turn.next(&watch, "map-ordered-input").await {
                    Next::Item(index, item) => (index, item),
                    Next::Ended | Next::Cancelled => return,
                    Next::Panicked(index, panic) => {
                        // The input is broken: its panic is the last item.
                        drop(turn);
                        let _ = done_tx.send((index, Err(panic))).await;
                        return;
                    }
                };
                drop(turn);
                // One unit of tokio's cooperative budget per item (neither the lock nor
                // async-channel takes any), so that a worker on an always-ready input lets
                // the other tasks of its thread run.
                tokio::task::coop::consume_budget().await;
                let call = catch_panic(name.clone(), async { f(item).await });
                let Some(result) = watch.run_until_cancelled(call).await else {
                    return;
                };
                if done_tx.send((index, result)).await.is_err() {
                    return;
                }
            }
        }));
    }
    drop(done_tx);

    MapOrdered {
        done: Box::pin(done_rx),
        buffer: ReorderBuffer::new(window),
        gate,
        watch: TokenWatch::new(&token),
        ended: false,
        cancelled: false,
        owed: 0,
        batch: concurrency,
        token: token.clone(),
        _stop_on_drop: token.drop_guard(),
    }
}

/// Stream returned by [`map_ordered`]: the results in input order.
///
/// `size_hint`: `(0, None)`: a cancellation can end it at any time, and the input decides how
/// many more come.
///
/// # Cancel safety
///
/// Reading with `StreamExt::next` is cancel safe: a dropped `next()` future loses no result.
#[must_use = "streams do nothing unless polled"]
pub struct MapOrdered<R> {
    // Boxed so that `MapOrdered` is `Unpin` (async-channel's receiver is not).
    done: Pin<Box<async_channel::Receiver<Indexed<R>>>>,
    buffer: ReorderBuffer<Result<R, PanicError>>,
    gate: Arc<Gate>,
    watch: TokenWatch,
    ended: bool,
    cancelled: bool,
    // Results yielded but not yet published to the gate.
    owed: usize,
    batch: usize,
    // The workers' token, read once when they have all stopped: its waiters are woken one
    // after another, so the workers may see the cancel (and stop) before `watch` is set.
    token: CancellationToken,
    // Dropping the output stops the workers.
    _stop_on_drop: DropGuard,
}

impl<R> MapOrdered<R> {
    /// `true` when the output ended because the token was cancelled (results still in
    /// flight were dropped), not because every result was yielded.
    #[must_use]
    pub fn was_cancelled(&self) -> bool {
        self.cancelled
    }

    /// Finished results waiting for an earlier one.
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.buffer.len()
    }
}

// No field is ever pinned: the buffered results are plain values.
impl<R> Unpin for MapOrdered<R> {}

impl<R> Stream for MapOrdered<R> {
    type Item = Result<R, PanicError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            if this.watch.is_cancelled() {
                this.ended = true;
                this.cancelled = true;
                return Poll::Ready(None);
            }
            if let Some(result) = this.buffer.pop() {
                // The window moves on in batches (publishing costs a fence); always before
                // this stream waits, so the workers can go on.
                this.owed += 1;
                if this.owed >= this.batch {
                    this.gate.release(std::mem::take(&mut this.owed));
                }
                return Poll::Ready(Some(result));
            }
            match this.done.as_mut().poll_next(cx) {
                Poll::Ready(Some((index, result))) => {
                    // Within the window by construction: the gate hands out index `i` only
                    // once `i < released + window`, and `released` never passes `next`.
                    if let Err(refused) = this.buffer.push(index, result) {
                        unreachable!("map_ordered: result outside the window: {refused}");
                    }
                }
                // Every task has stopped; after a cancel, what is buffered is dropped. A result
                // left behind a gap can only be the work of a cancel too.
                Poll::Ready(None) => {
                    this.ended = true;
                    this.cancelled = this.token.is_cancelled() || !this.buffer.is_empty();
                    return Poll::Ready(None);
                }
                Poll::Pending => {
                    if this.owed > 0 {
                        this.gate.release(std::mem::take(&mut this.owed));
                    }
                    this.watch.register(cx.waker());
                    if this.watch.is_cancelled() {
                        this.ended = true;
                        this.cancelled = true;
                        return Poll::Ready(None);
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

impl<R> FusedStream for MapOrdered<R> {
    fn is_terminated(&self) -> bool {
        self.ended
    }
}

impl<R> fmt::Debug for MapOrdered<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MapOrdered")
            .field("next_index", &self.buffer.next_index())
            .field("waiting", &self.buffer.len())
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}
