//! `TeeOutput`: one output of a tee.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::FusedStream;
use taskweave_supervise::PanicError;
use taskweave_supervise::internal::chan;
use tokio_util::sync::CancellationToken;

use crate::Policy;

/// What the tee's task and all its outputs share.
pub(crate) struct TeeShared {
    /// Outputs not yet dropped; the last one to go stops the task.
    pub(crate) alive: AtomicUsize,
    /// The tee's own child token.
    pub(crate) token: CancellationToken,
    /// Set when the input (or a clone) panicked.
    pub(crate) panic: OnceLock<PanicError>,
}

/// What the tee's task and one output share.
pub(crate) struct OutputState {
    pub(crate) policy: Policy,
    pub(crate) lagged: AtomicU64,
    pub(crate) disconnected: AtomicBool,
}

/// The receiving end of an output.
pub(crate) enum Rx<T> {
    /// Lockstep and disconnect outputs: taken from the channel in batches.
    Batched(chan::Receiver<T>),
    /// Drop-oldest outputs. Boxed so that `TeeOutput` is `Unpin` (async-channel's receiver is
    /// not).
    Evicting(Pin<Box<async_channel::Receiver<T>>>),
}

impl<T> Rx<T> {
    fn len(&self) -> usize {
        match self {
            Rx::Batched(rx) => rx.len(),
            Rx::Evicting(rx) => rx.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `true` once the tee has closed this output (items may still wait).
    fn is_closed(&self) -> bool {
        match self {
            Rx::Batched(rx) => rx.is_closed(),
            Rx::Evicting(rx) => rx.is_closed(),
        }
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        match self {
            Rx::Batched(rx) => rx.poll_next(cx),
            Rx::Evicting(rx) => rx.as_mut().poll_next(cx),
        }
    }
}

/// One output of [`tee`](crate::tee), [`tee_n`](crate::tee_n) or
/// [`tee_with`](crate::tee_with): every value of the input, in the input's order, minus
/// what its [`Policy`] dropped.
///
/// - The stream ends when the tee's task stops (input ended, token cancelled, a panic) or
///   when this output was disconnected, after the items already buffered.
/// - Dropping it never stalls the other outputs; dropping the last one stops the tee's task.
///
/// `TeeOutput` is `Unpin`, and `Send` and `Sync` when `T: Send`.
///
/// `size_hint`: the values already waiting for this output as the lower bound; exactly those
/// once the tee has closed it; `(0, Some(0))` once it has ended.
///
/// # Cancel safety
///
/// Reading with `StreamExt::next` is cancel safe: a dropped `next()` future loses no item.
#[must_use = "streams do nothing unless polled"]
pub struct TeeOutput<T> {
    pub(crate) output: Rx<T>,
    pub(crate) state: Arc<OutputState>,
    pub(crate) shared: Arc<TeeShared>,
    pub(crate) done: bool,
}

impl<T> TeeOutput<T> {
    /// This output's policy.
    #[must_use]
    pub fn policy(&self) -> Policy {
        self.state.policy
    }

    /// Items dropped from this output so far because it fell behind (a
    /// [`Policy::DropOldest`] output; always 0 for the others).
    #[must_use]
    pub fn lagged(&self) -> u64 {
        self.state.lagged.load(Ordering::Relaxed)
    }

    /// `true` once a [`Policy::Disconnect`] output was cut off for falling behind.
    #[must_use]
    pub fn is_disconnected(&self) -> bool {
        self.state.disconnected.load(Ordering::Acquire)
    }

    /// The panic that stopped the tee (in the input stream, or in `T::clone`), if one did.
    /// The outputs end early then; this says why.
    #[must_use]
    pub fn panic(&self) -> Option<&PanicError> {
        self.shared.panic.get()
    }

    /// Items buffered for this output.
    #[must_use]
    pub fn len(&self) -> usize {
        self.output.len()
    }

    /// `true` when no item is buffered for this output.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.output.is_empty()
    }
}

impl<T> Stream for TeeOutput<T> {
    type Item = T;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if self.done {
            return Poll::Ready(None);
        }
        let polled = self.output.poll_next(cx);
        if let Poll::Ready(None) = polled {
            self.done = true;
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

impl<T> FusedStream for TeeOutput<T> {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl<T> Drop for TeeOutput<T> {
    fn drop(&mut self) {
        // AcqRel: the last output to go sees every other drop.
        if self.shared.alive.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.token.cancel();
        }
    }
}

impl<T> fmt::Debug for TeeOutput<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TeeOutput")
            .field("policy", &self.state.policy)
            .field("buffered", &self.output.len())
            .field("lagged", &self.lagged())
            .field("disconnected", &self.is_disconnected())
            .finish()
    }
}
