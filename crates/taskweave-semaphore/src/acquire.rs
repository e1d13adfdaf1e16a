//! The acquire futures, named (`Acquire`, `AcquireOwned`), and `PollSemaphore` for
//! `poll_acquire`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use pin_project_lite::pin_project;
use tokio_util::sync::{
    CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned,
};

use crate::semaphore::Inner;
use crate::state::{Joined, Polled, Ticket};
use crate::{AcquireError, OwnedPermit, Permit, Semaphore, TryAcquireError};

/// How a wait's first poll ended.
enum Started {
    Done(Result<(), AcquireError>),
    Queued(Ticket),
}

/// One wait for permits: the part of an acquire future that needs no pinning.
#[derive(Debug)]
struct Wait {
    permits: usize,
    /// The waiter's ticket while queued.
    ticket: Option<Ticket>,
    done: bool,
}

impl Wait {
    fn new(permits: usize) -> Self {
        Wait {
            permits,
            ticket: None,
            done: false,
        }
    }

    /// Drives the wait. `cancelled` is made (by `arm`) when the wait queues and `token` must
    /// be watched; it is polled before the wait list, so that a cancellation observed before
    /// the permits are taken wins over a grant.
    fn poll<C: Future<Output = ()>>(
        &mut self,
        inner: &Inner,
        token: &CancellationToken,
        mut cancelled: Pin<&mut Option<C>>,
        arm: impl FnOnce() -> C,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), AcquireError>> {
        assert!(!self.done, "an acquire future polled after completion");
        let watched = inner.watches(token);
        let ticket = match self.ticket.take() {
            Some(ticket) => ticket,
            None => match self.start(inner, token, watched, cx.waker()) {
                Started::Done(outcome) => return self.finish(outcome),
                Started::Queued(ticket) => {
                    if watched {
                        cancelled.set(Some(arm()));
                    }
                    ticket
                }
            },
        };
        if let Some(cancelled) = cancelled.as_mut().as_pin_mut()
            && cancelled.poll(cx).is_ready()
        {
            // Whatever was assigned, a full grant included, goes to the waiters behind.
            inner.state.abandon(&ticket);
            return self.finish(Err(AcquireError::Cancelled));
        }
        match inner.state.poll_queued(&ticket, cx.waker()) {
            Polled::Pending => {
                self.ticket = Some(ticket);
                Poll::Pending
            }
            Polled::Done(outcome) => {
                let outcome = match outcome {
                    Err(AcquireError::Closed) => Err(inner.closed(token)),
                    // A wait on the bound token: its cancellation closed the semaphore after
                    // the grant and before this poll; the cancellation wins here too.
                    Ok(()) if !watched && inner.state.is_closed() && token.is_cancelled() => {
                        inner.state.release(self.permits);
                        Err(AcquireError::Cancelled)
                    }
                    outcome => outcome,
                };
                self.finish(outcome)
            }
        }
    }

    /// The first poll: the token first (one already cancelled wins over free permits), then
    /// the fast path, then the queue.
    fn start(
        &self,
        inner: &Inner,
        token: &CancellationToken,
        watched: bool,
        waker: &Waker,
    ) -> Started {
        if watched && token.is_cancelled() {
            return Started::Done(Err(AcquireError::Cancelled));
        }
        let refused = match inner.state.try_acquire(self.permits) {
            Ok(()) => return Started::Done(Ok(())),
            Err(TryAcquireError::NoPermits) => match inner.state.join(self.permits, waker) {
                Joined::Granted => return Started::Done(Ok(())),
                Joined::Queued(ticket) => return Started::Queued(ticket),
                Joined::Failed(error) => error,
            },
            Err(TryAcquireError::Closed) => AcquireError::Closed,
            Err(TryAcquireError::TooLarge {
                requested,
                capacity,
            }) => AcquireError::TooLarge {
                requested,
                capacity,
            },
        };
        Started::Done(Err(match refused {
            AcquireError::Closed => inner.closed(token),
            error => error,
        }))
    }

    fn finish(&mut self, outcome: Result<(), AcquireError>) -> Poll<Result<(), AcquireError>> {
        self.done = true;
        Poll::Ready(outcome)
    }

    /// Gives up a wait in progress (the future is dropped).
    fn abandon(&mut self, inner: &Inner) {
        if let Some(ticket) = self.ticket.take() {
            inner.state.abandon(&ticket);
        }
    }
}

pin_project! {
    /// The future of [`Semaphore::acquire`] and [`Semaphore::acquire_many`].
    ///
    /// # Cancel safety
    ///
    /// Dropping it gives up the place in the queue; whatever had been assigned to it goes
    /// to the next waiter.
    #[must_use = "futures do nothing unless polled"]
    pub struct Acquire<'a> {
        semaphore: &'a Semaphore,
        token: &'a CancellationToken,
        wait: Wait,
        #[pin]
        cancelled: Option<WaitForCancellationFuture<'a>>,
    }

    impl<'a> PinnedDrop for Acquire<'a> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            this.wait.abandon(&this.semaphore.inner);
        }
    }
}

impl<'a> Acquire<'a> {
    pub(crate) fn new(
        semaphore: &'a Semaphore,
        token: &'a CancellationToken,
        permits: usize,
    ) -> Self {
        Acquire {
            semaphore,
            token,
            wait: Wait::new(permits),
            cancelled: None,
        }
    }
}

impl<'a> Future for Acquire<'a> {
    type Output = Result<Permit<'a>, AcquireError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let semaphore: &'a Semaphore = this.semaphore;
        let token: &'a CancellationToken = this.token;
        let permits = this.wait.permits;
        this.wait
            .poll(
                &semaphore.inner,
                token,
                this.cancelled,
                || token.cancelled(),
                cx,
            )
            .map_ok(|()| Permit::new(&semaphore.inner, permits))
    }
}

impl fmt::Debug for Acquire<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acquire")
            .field("permits", &self.wait.permits)
            .field("queued", &self.wait.ticket.is_some())
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The `'static` future of [`Semaphore::acquire_owned`] and
    /// [`Semaphore::acquire_many_owned`].
    ///
    /// # Cancel safety
    ///
    /// As [`Acquire`].
    #[must_use = "futures do nothing unless polled"]
    pub struct AcquireOwned {
        semaphore: Semaphore,
        token: CancellationToken,
        wait: Wait,
        #[pin]
        cancelled: Option<WaitForCancellationFutureOwned>,
    }

    impl PinnedDrop for AcquireOwned {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            this.wait.abandon(&this.semaphore.inner);
        }
    }
}

impl AcquireOwned {
    pub(crate) fn new(semaphore: Semaphore, token: CancellationToken, permits: usize) -> Self {
        AcquireOwned {
            semaphore,
            token,
            wait: Wait::new(permits),
            cancelled: None,
        }
    }
}

impl Future for AcquireOwned {
    type Output = Result<OwnedPermit, AcquireError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let inner = &this.semaphore.inner;
        let token = &*this.token;
        let permits = this.wait.permits;
        this.wait
            .poll(
                inner,
                token,
                this.cancelled,
                || token.clone().cancelled_owned(),
                cx,
            )
            .map_ok(|()| OwnedPermit::new(Arc::clone(inner), permits))
    }
}

impl fmt::Debug for AcquireOwned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcquireOwned")
            .field("permits", &self.wait.permits)
            .field("queued", &self.wait.ticket.is_some())
            .finish_non_exhaustive()
    }
}

/// A [`Semaphore`] with a `poll_acquire` method, for a hand-written future or a tower
/// `Service::poll_ready` (as tokio-util's `PollSemaphore` is for tokio's): no boxed future per
/// acquire. The token's cancellation future is allocated once, here.
///
/// # Examples
///
/// ```
/// use std::future::poll_fn;
/// use taskweave_semaphore::{PollSemaphore, Semaphore};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let mut limit = PollSemaphore::new(Semaphore::new(1), CancellationToken::new());
/// let permit = poll_fn(|cx| limit.poll_acquire(cx)).await.unwrap();
/// assert_eq!(limit.semaphore().in_use(), 1);
/// drop(permit);
/// # }
/// ```
pub struct PollSemaphore {
    semaphore: Semaphore,
    token: CancellationToken,
    wait: Wait,
    cancelled: Pin<Box<Option<WaitForCancellationFutureOwned>>>,
}

impl PollSemaphore {
    /// Polls `semaphore` for permits, the waits ending when `token` is cancelled.
    #[must_use]
    pub fn new(semaphore: Semaphore, token: CancellationToken) -> Self {
        PollSemaphore {
            semaphore,
            token,
            wait: Wait::new(1),
            cancelled: Box::pin(None),
        }
    }

    /// Polls for one permit: `Pending` while waiting in the queue (the waker is woken when the
    /// permit or the token's cancellation comes). After a `Ready`, the next call starts a new
    /// wait.
    ///
    /// # Errors
    ///
    /// As [`Semaphore::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Not calling it again gives the wait up only when the `PollSemaphore` is dropped; until
    /// then its place in the queue is kept (and so are permits assigned to it).
    pub fn poll_acquire(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<OwnedPermit, AcquireError>> {
        if self.wait.done {
            self.wait = Wait::new(1);
            self.cancelled.set(None);
        }
        let inner = &self.semaphore.inner;
        let token = &self.token;
        let polled = self.wait.poll(
            inner,
            token,
            self.cancelled.as_mut(),
            || token.clone().cancelled_owned(),
            cx,
        );
        polled.map_ok(|()| OwnedPermit::new(Arc::clone(inner), 1))
    }

    /// The semaphore polled.
    #[must_use]
    pub fn semaphore(&self) -> &Semaphore {
        &self.semaphore
    }
}

impl Drop for PollSemaphore {
    fn drop(&mut self) {
        self.wait.abandon(&self.semaphore.inner);
    }
}

impl fmt::Debug for PollSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollSemaphore")
            .field("semaphore", &self.semaphore)
            .field("queued", &self.wait.ticket.is_some())
            .finish_non_exhaustive()
    }
}
