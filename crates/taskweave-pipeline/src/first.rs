//! `First`: the first n items of a stream, then its input is dropped.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::FusedStream;
use pin_project_lite::pin_project;

pin_project! {
    /// Stream returned by [`PipelineExt::first`](crate::PipelineExt::first).
    ///
    /// `size_hint`: the input's, each bound capped at the items still to be taken.
    #[must_use = "streams do nothing unless polled"]
    pub struct First<S> {
        // `None` once `n` items are out: the input is dropped then.
        #[pin]
        input: Option<S>,
        left: usize,
        ended: bool,
    }
}

impl<S> First<S> {
    pub(crate) fn new(input: S, n: usize) -> Self {
        First {
            input: (n > 0).then_some(input),
            left: n,
            ended: n == 0,
        }
    }

    /// The input, until `n` items have been taken (it is dropped then).
    #[must_use]
    pub fn get_ref(&self) -> Option<&S> {
        self.input.as_ref()
    }

    /// The input, mutably, until `n` items have been taken.
    #[must_use]
    pub fn get_mut(&mut self) -> Option<&mut S> {
        self.input.as_mut()
    }

    /// The pinned input, until `n` items have been taken.
    #[must_use]
    pub fn get_pin_mut(self: Pin<&mut Self>) -> Option<Pin<&mut S>> {
        self.project().input.as_pin_mut()
    }

    /// The input, if fewer than `n` items have been taken.
    #[must_use]
    pub fn into_inner(self) -> Option<S> {
        self.input
    }

    /// Items still to be taken.
    #[must_use]
    pub fn remaining(&self) -> usize {
        self.left
    }
}

impl<S: Stream> Stream for First<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let mut this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        let Some(input) = this.input.as_mut().as_pin_mut() else {
            *this.ended = true;
            return Poll::Ready(None);
        };
        match input.poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                // Kept: a `Stage` input can still say why it ended.
                *this.ended = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(item)) => {
                *this.left -= 1;
                if *this.left == 0 {
                    // Stops the input now, not when this adapter is dropped.
                    this.input.set(None);
                }
                Poll::Ready(Some(item))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.input {
            Some(input) if !self.ended => {
                let (lower, upper) = input.size_hint();
                let upper = upper.map_or(self.left, |upper| upper.min(self.left));
                (lower.min(self.left), Some(upper))
            }
            _ => (0, Some(0)),
        }
    }
}

impl<S: Stream> FusedStream for First<S> {
    fn is_terminated(&self) -> bool {
        self.ended || (self.left == 0)
    }
}

impl<S> fmt::Debug for First<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("First")
            .field("remaining", &self.left)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}
