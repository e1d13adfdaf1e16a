//! `reorder`: a stream adapter that puts `(index, value)` items back in index order.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::FusedStream;
use pin_project_lite::pin_project;
use taskweave_supervise::TokenWatch;
use tokio_util::sync::CancellationToken;

use crate::{ReorderBuffer, ReorderError};

/// Puts the `(index, value)` items of `input` back in index order (indices from 0), holding
/// at most `window` of them.
///
/// - Yields `Ok(value)` in index order, as soon as the next index has arrived.
/// - An index pushed twice, or one at or beyond `next + window`, is yielded as
///   `Err(ReorderError::Refused(..))` carrying the value, and the adapter goes on. (Holding a
///   single input back cannot help here: the missing index could only come from that same
///   input, behind the held item, so waiting would hang. To hold producers back, have them
///   push into a [`ReorderBuffer`] or use [`map_ordered`](crate::map_ordered), whose window
///   is enforced before any work starts.)
/// - When the input ends with gaps, yields one `Err(ReorderError::Missing(..))` listing them,
///   then the values buffered after the gaps, in order: no value that was accepted is lost.
/// - Ends when the input has ended and everything was yielded, or as soon as `token` is
///   cancelled (one atomic load per poll).
///
/// An adapter: no task. Backpressure is the input's.
///
/// # Examples
///
/// ```
/// use futures::StreamExt;
/// use taskweave_reorder::reorder;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let input = futures::stream::iter([(2, 'c'), (0, 'a'), (1, 'b')]);
/// let out: Vec<char> = reorder(CancellationToken::new(), input, 4)
///     .map(Result::unwrap)
///     .collect()
///     .await;
/// assert_eq!(out, ['a', 'b', 'c']);
/// # }
/// ```
///
/// # Panics
///
/// Panics if `window` is zero.
pub fn reorder<S, T>(token: CancellationToken, input: S, window: usize) -> Reorder<S, T>
where
    S: Stream<Item = (u64, T)>,
{
    Reorder {
        input,
        buffer: ReorderBuffer::new(window),
        watch: TokenWatch::new(&token),
        input_ended: false,
        gaps_reported: false,
        done: false,
        cancelled: false,
    }
}

pin_project! {
    /// Stream returned by [`reorder`].
    ///
    /// `size_hint`: `0` as the lower bound (a cancellation can end it at any time); the upper
    /// bound is the input's plus what the buffer holds plus one (a gap report), when the
    /// input has one; `(0, Some(0))` once it has ended.
    ///
    /// # Cancel safety
    ///
    /// As cancel safe as its input: a dropped `next()` future loses nothing that the input
    /// had handed over (it waits in the buffer).
    #[must_use = "streams do nothing unless polled"]
    pub struct Reorder<S, T> {
        #[pin]
        input: S,
        buffer: ReorderBuffer<T>,
        watch: TokenWatch,
        input_ended: bool,
        gaps_reported: bool,
        done: bool,
        cancelled: bool,
    }
}

impl<S, T> Reorder<S, T> {
    /// `true` when the stream ended because the token was cancelled (what was buffered is
    /// left in [`buffer`](Self::buffer)), not because the input ended.
    #[must_use]
    pub fn was_cancelled(&self) -> bool {
        self.cancelled
    }

    /// The buffer: its next index, what it holds.
    #[must_use]
    pub fn buffer(&self) -> &ReorderBuffer<T> {
        &self.buffer
    }

    /// The input.
    #[must_use]
    pub fn get_ref(&self) -> &S {
        &self.input
    }

    /// The input, mutably (items taken from it directly skip the buffer).
    #[must_use]
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.input
    }

    /// The pinned input.
    #[must_use]
    pub fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut S> {
        self.project().input
    }

    /// The input and the buffer, with the values it holds, so that nothing taken is lost.
    #[must_use]
    pub fn into_inner(self) -> (S, ReorderBuffer<T>) {
        (self.input, self.buffer)
    }
}

impl<S, T> Stream for Reorder<S, T>
where
    S: Stream<Item = (u64, T)>,
{
    type Item = Result<T, ReorderError<T>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        loop {
            if *this.done {
                return Poll::Ready(None);
            }
            if this.watch.is_cancelled() {
                *this.done = true;
                *this.cancelled = true;
                return Poll::Ready(None);
            }
            if let Some(value) = this.buffer.pop() {
                return Poll::Ready(Some(Ok(value)));
            }
            if *this.input_ended {
                let next = this.buffer.next_after_end(this.gaps_reported);
                *this.done = next.is_none();
                return Poll::Ready(next.map(|next| next.map_err(ReorderError::Missing)));
            }
            match this.input.as_mut().poll_next(cx) {
                Poll::Pending => {
                    this.watch.register(cx.waker());
                    if this.watch.is_cancelled() {
                        *this.done = true;
                        *this.cancelled = true;
                        return Poll::Ready(None);
                    }
                    return Poll::Pending;
                }
                Poll::Ready(None) => *this.input_ended = true,
                Poll::Ready(Some((index, value))) => {
                    if let Err(refused) = this.buffer.push(index, value) {
                        return Poll::Ready(Some(Err(ReorderError::Refused(refused))));
                    }
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            return (0, Some(0));
        }
        // Cancellation can end it at any time; a gap report adds one item.
        let upper = if self.input_ended {
            Some(self.buffer.len() + 1)
        } else {
            self.input
                .size_hint()
                .1
                .and_then(|upper| upper.checked_add(self.buffer.len() + 1))
        };
        (0, upper)
    }
}

impl<S, T> FusedStream for Reorder<S, T>
where
    S: Stream<Item = (u64, T)>,
{
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl<S, T> fmt::Debug for Reorder<S, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reorder")
            .field("buffer", &self.buffer)
            .field("input_ended", &self.input_ended)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}
