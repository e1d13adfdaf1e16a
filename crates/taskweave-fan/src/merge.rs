//! `merge`: any number of streams into one, fairly.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::FusedStream;
use taskweave_supervise::TokenWatch;
use tokio_util::sync::CancellationToken;

/// Merges `streams` into one stream, fairly, until all of them end or `token` is cancelled.
///
/// **Fairness rule**: each poll starts with the input after the one that yielded last, so
/// inputs take turns (round-robin): with every input ready each gets an equal share, and a
/// busy input can never starve the others. Chained `StreamExt::merge` calls, by contrast, do
/// not share equally: each `merge` alternates between its two sides, so in
/// `a.merge(b).merge(c)` with every input ready `c` goes first on half the polls and `a` and
/// `b` on a quarter each. An input that ends is removed from the rotation and dropped at once
/// (no busy loop on a finished input).
/// Items of one input keep their order; no order holds across inputs.
///
/// Backpressure is each input's: nothing is buffered. No task is spawned: the merge runs when
/// it is polled, and dropping it drops the inputs. The inputs must be `Unpin` (use
/// `Box::pin` for others) and of one type (box them as `Pin<Box<dyn Stream<Item = T> +
/// Send>>` to mix kinds).
///
/// # Examples
///
/// ```
/// use futures::StreamExt;
/// use taskweave_fan::merge;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let busy = futures::stream::iter(vec![1, 1, 1, 1]);
/// let quiet = futures::stream::iter(vec![2, 2]);
/// let merged: Vec<u8> = merge(CancellationToken::new(), [busy, quiet]).collect().await;
/// assert_eq!(merged, [1, 2, 1, 2, 1, 1], "turns are taken, then the rest");
/// # }
/// ```
pub fn merge<I, S>(token: CancellationToken, streams: I) -> Merge<S>
where
    I: IntoIterator<Item = S>,
    S: Stream + Unpin,
{
    Merge {
        streams: streams.into_iter().collect(),
        next: 0,
        watch: TokenWatch::new(&token),
        done: false,
    }
}

/// Stream returned by [`merge`].
///
/// `size_hint`: `0` as the lower bound, because a cancellation can end it at any time
/// (tokio-stream's merge sums its inputs' lower bounds, which is right only without a token);
/// the upper bound is the sum of the inputs' upper bounds while they all have one;
/// `(0, Some(0))` once it has ended.
#[must_use = "streams do nothing unless polled"]
pub struct Merge<S> {
    streams: Vec<S>,
    /// The input to poll first next time: the one after the last that yielded.
    next: usize,
    watch: TokenWatch,
    done: bool,
}

impl<S> Merge<S> {
    /// Inputs that have not ended yet.
    #[must_use]
    pub fn remaining(&self) -> usize {
        self.streams.len()
    }

    fn finish(&mut self) -> Poll<Option<S::Item>>
    where
        S: Stream,
    {
        self.done = true;
        // Dropping the inputs now releases whatever they hold (channels, connections).
        self.streams.clear();
        Poll::Ready(None)
    }
}

impl<S: Stream + Unpin> Stream for Merge<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if this.watch.is_cancelled() {
            return this.finish();
        }
        let mut to_poll = this.streams.len();
        let mut index = if to_poll == 0 { 0 } else { this.next % to_poll };
        while to_poll > 0 && !this.streams.is_empty() {
            match Pin::new(&mut this.streams[index]).poll_next(cx) {
                Poll::Ready(Some(item)) => {
                    this.next = index + 1;
                    return Poll::Ready(Some(item));
                }
                Poll::Ready(None) => {
                    // The next input slides into `index`: poll it next, without advancing.
                    drop(this.streams.remove(index));
                    // The inputs after it slid down one place: so does the turn, so that the
                    // next poll still starts with the input after the one that yielded last.
                    if index < this.next {
                        this.next -= 1;
                    }
                    if index >= this.streams.len() {
                        index = 0;
                    }
                }
                Poll::Pending => index = (index + 1) % this.streams.len(),
            }
            to_poll -= 1;
        }
        if this.streams.is_empty() {
            return this.finish();
        }
        this.watch.register(cx.waker());
        // A cancellation between the first check and the registration woke nobody.
        if this.watch.is_cancelled() {
            return this.finish();
        }
        Poll::Pending
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            return (0, Some(0));
        }
        // Cancellation can end it early, so the lower bound is 0.
        let upper = self.streams.iter().try_fold(0_usize, |sum, stream| {
            stream
                .size_hint()
                .1
                .and_then(|upper| sum.checked_add(upper))
        });
        (0, upper)
    }
}

impl<S: Stream + Unpin> FusedStream for Merge<S> {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl<S> fmt::Debug for Merge<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Merge")
            .field("remaining", &self.streams.len())
            .field("next", &self.next)
            .field("done", &self.done)
            .finish()
    }
}
