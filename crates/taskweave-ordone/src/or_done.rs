//! `OrDone`: the adapter, its constructor function and its extension trait.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::FusedStream;
use pin_project_lite::pin_project;
use taskweave_supervise::TokenWatch;
use tokio_util::sync::CancellationToken;

/// Wraps `stream` so that it ends as soon as `token` is cancelled or `stream` ends.
///
/// Cancellation wins: once the token is cancelled, the next poll returns `None` even if the
/// input has items ready, and the input is never polled again (it is dropped with the
/// adapter). Items keep their order; backpressure is the input's. `OrDone` is `Unpin` when
/// the input is.
///
/// # Examples
///
/// ```
/// use futures::StreamExt;
/// use taskweave_ordone::or_done;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let token = CancellationToken::new();
/// token.cancel();
/// let items: Vec<u8> = or_done(token, futures::stream::iter([1, 2, 3])).collect().await;
/// assert!(items.is_empty(), "cancelled before the first poll");
/// # }
/// ```
pub fn or_done<S: Stream>(token: CancellationToken, stream: S) -> OrDone<S> {
    OrDone {
        stream,
        // One waker registered on the token, once: each poll then costs one atomic load
        // instead of the token's lock (`take_until(token.cancelled())` takes it every item).
        watch: TokenWatch::new(&token),
        done: false,
    }
}

/// [`or_done`] as a method on any stream.
pub trait OrDoneExt: Stream + Sized {
    /// Ends this stream as soon as `token` is cancelled; see [`or_done`].
    ///
    /// # Examples
    ///
    /// ```
    /// use futures::StreamExt;
    /// use taskweave_ordone::OrDoneExt;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let items: Vec<u8> = futures::stream::iter([1, 2])
    ///     .or_done(CancellationToken::new())
    ///     .collect()
    ///     .await;
    /// assert_eq!(items, [1, 2], "the input's end ends it too");
    /// # }
    /// ```
    fn or_done(self, token: CancellationToken) -> OrDone<Self> {
        or_done(token, self)
    }
}

impl<S: Stream> OrDoneExt for S {}

pin_project! {
    /// Stream returned by [`or_done`] and [`OrDoneExt::or_done`].
    ///
    /// `size_hint`: `0` as the lower bound (a cancellation can end it at any time) and the
    /// input's upper bound; `(0, Some(0))` once it has ended.
    #[must_use = "streams do nothing unless polled"]
    pub struct OrDone<S> {
        #[pin]
        stream: S,
        watch: TokenWatch,
        done: bool,
    }
}

impl<S> OrDone<S> {
    /// The input.
    #[must_use]
    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    /// The input, mutably (taking items from it directly bypasses the token check).
    #[must_use]
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// The pinned input.
    #[must_use]
    pub fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut S> {
        self.project().stream
    }

    /// The input, without the token.
    #[must_use]
    pub fn into_inner(self) -> S {
        self.stream
    }
}

impl<S: Stream> Stream for OrDone<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        // The token first: cancellation wins over an item that is ready at the same time.
        if this.watch.is_cancelled() {
            *this.done = true;
            return Poll::Ready(None);
        }
        match this.stream.poll_next(cx) {
            Poll::Pending => {
                this.watch.register(cx.waker());
                // A cancellation between the check above and the registration would have
                // woken nobody: look again.
                if this.watch.is_cancelled() {
                    *this.done = true;
                    return Poll::Ready(None);
                }
                Poll::Pending
            }
            Poll::Ready(None) => {
                *this.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(item)) => Poll::Ready(Some(item)),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            return (0, Some(0));
        }
        // Cancellation can end it at any time.
        (0, self.stream.size_hint().1)
    }
}

impl<S: Stream> FusedStream for OrDone<S> {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl<S> fmt::Debug for OrDone<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OrDone")
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}
