//! `RateLimited`: a stream adapter that lets items through at the limiter's rate.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures::Stream;
use futures::stream::FusedStream;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::{CheckError, RateLimiter};

/// Rate-limits any stream; see [`RateLimitExt::rate_limited`].
pub trait RateLimitExt: Stream + Sized {
    /// Yields the items of `self`, each after taking one token from `limiter`.
    ///
    /// Order is kept; an item waits (holding back the ones after it) until a token is there.
    /// The limiter can be shared with other streams and callers: they draw from the same
    /// bucket. No task is spawned: the stream makes progress while it is polled.
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime with a time driver (it creates a timer).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures::StreamExt;
    /// use taskweave_limit::{Quota, RateLimitExt, RateLimiter};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let started = Instant::now();
    /// let sent: Vec<u32> = futures::stream::iter(1..=4)
    ///     .rate_limited(RateLimiter::new(Quota::per_second(10).with_burst(1)).with_tokio_clock())
    ///     .collect()
    ///     .await;
    /// assert_eq!(sent, [1, 2, 3, 4]);
    /// assert_eq!(started.elapsed(), Duration::from_millis(300));
    /// # }
    /// ```
    fn rate_limited(self, limiter: RateLimiter) -> RateLimited<Self> {
        RateLimited {
            stream: self,
            limiter,
            pending: None,
            sleep: Box::pin(tokio::time::sleep_until(Instant::now())),
            sleeping: false,
            done: false,
        }
    }
}

impl<S: Stream> RateLimitExt for S {}

pin_project! {
    /// Stream returned by [`RateLimitExt::rate_limited`].
    ///
    /// `size_hint`: the input's, plus the item held back for the limiter; `(0, Some(0))`
    /// once it has ended.
    #[must_use = "streams do nothing unless polled"]
    pub struct RateLimited<S: Stream> {
        #[pin]
        stream: S,
        limiter: RateLimiter,
        pending: Option<S::Item>,
        sleep: Pin<Box<Sleep>>,
        sleeping: bool,
        done: bool,
    }
}

impl<S: Stream> RateLimited<S> {
    /// The input.
    #[must_use]
    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    /// The input, mutably (items taken from it directly are not rate limited).
    #[must_use]
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// The pinned input.
    #[must_use]
    pub fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut S> {
        self.project().stream
    }

    /// The input, and the item taken from it that was waiting for the limiter (if any), so
    /// that nothing taken is lost.
    #[must_use]
    pub fn into_inner(self) -> (S, Option<S::Item>) {
        (self.stream, self.pending)
    }
}

impl<S: Stream> Stream for RateLimited<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let mut this = self.project();
        loop {
            if this.pending.is_none() {
                if *this.done {
                    return Poll::Ready(None);
                }
                match ready!(this.stream.as_mut().poll_next(cx)) {
                    Some(item) => *this.pending = Some(item),
                    None => {
                        *this.done = true;
                        return Poll::Ready(None);
                    }
                }
            }
            if *this.sleeping {
                ready!(this.sleep.as_mut().poll(cx));
                *this.sleeping = false;
            }
            match this.limiter.check_n(1) {
                Ok(()) => return Poll::Ready(this.pending.take()),
                Err(CheckError::NotYet { wait }) => {
                    this.sleep.as_mut().reset(Instant::now() + wait);
                    *this.sleeping = true;
                }
                // One token never exceeds a burst (at least 1).
                Err(CheckError::ExceedsBurst { .. }) => return Poll::Ready(this.pending.take()),
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let pending = usize::from(self.pending.is_some());
        let (lower, upper) = if self.done {
            (0, Some(0))
        } else {
            self.stream.size_hint()
        };
        (
            lower.saturating_add(pending),
            upper.and_then(|upper| upper.checked_add(pending)),
        )
    }
}

impl<S: Stream> FusedStream for RateLimited<S> {
    fn is_terminated(&self) -> bool {
        self.done && self.pending.is_none()
    }
}

impl<S: Stream> fmt::Debug for RateLimited<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimited")
            .field("limiter", &self.limiter)
            .field("waiting", &self.pending.is_some())
            .field("done", &self.done)
            .finish()
    }
}
