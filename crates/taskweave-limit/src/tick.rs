//! `TickLimiter`: strict spacing, never a burst.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::WaitError;

/// Lets callers through at most once per `period`, one at a time, never in a burst: Go's
/// `time.Tick` used as a limiter, without its pitfalls.
///
/// - Each [`wait`](Self::wait) gets the next free slot (`period` after the previous one) and
///   sleeps until it. Slots are handed out in call order.
/// - Missed slots are not replayed: after a quiet minute the next caller goes at once, and
///   the one after it a full period later (a token bucket with a burst of 1 would behave the
///   same; this type is for when "never two within a period" is the rule).
/// - A wait cancelled by its token (or dropped) gives its slot back if no later caller took
///   the next one; otherwise the slot stays unused.
/// - Slots are spaced exactly; when a wait returns depends also on when its task is polled,
///   so on a busy runtime two returns can be closer than a period in wall-clock time.
/// - [`close`](Self::close) makes every waiter (and later caller) return
///   [`WaitError::Closed`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_limit::TickLimiter;
/// use tokio::time::Instant;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let limiter = TickLimiter::new(Duration::from_millis(100));
/// let token = CancellationToken::new();
/// let started = Instant::now();
/// for _ in 0..3 {
///     limiter.wait(&token).await.unwrap();
/// }
/// assert_eq!(started.elapsed(), Duration::from_millis(200)); // at 0, 100 and 200 ms
/// # }
/// ```
#[derive(Clone)]
pub struct TickLimiter {
    inner: Arc<Inner>,
}

struct Inner {
    period: Duration,
    state: Mutex<State>,
    closed_notify: Notify,
}

struct State {
    /// The earliest instant the next slot may have.
    next: Instant,
    closed: bool,
}

impl TickLimiter {
    /// A limiter that lets one caller through per `period`.
    ///
    /// # Panics
    ///
    /// Panics if `period` is zero.
    #[must_use]
    pub fn new(period: Duration) -> Self {
        assert!(
            !period.is_zero(),
            "TickLimiter::new: period must be greater than zero"
        );
        TickLimiter {
            inner: Arc::new(Inner {
                period,
                state: Mutex::new(State {
                    next: Instant::now(),
                    closed: false,
                }),
                closed_notify: Notify::new(),
            }),
        }
    }

    /// Waits for the next slot, unless `token` is cancelled or the limiter closed first.
    ///
    /// # Errors
    ///
    /// [`WaitError::Cancelled`] or [`WaitError::Closed`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped wait gives its slot back like a cancelled one (when no later
    /// caller took the slot after it).
    pub fn wait<'a>(&'a self, token: &'a CancellationToken) -> TickWait<'a> {
        TickWait {
            limiter: self,
            token,
            slot: None,
            started: false,
            done: false,
            closed: self.inner.closed_notify.notified(),
            sleep: None,
            cancelled: None,
        }
    }

    /// Closes the limiter: every waiter returns [`WaitError::Closed`], and so do later calls.
    pub fn close(&self) {
        self.state().closed = true;
        self.inner.closed_notify.notify_waiters();
    }

    /// `true` after [`close`](Self::close).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.state().closed
    }

    /// The period.
    #[must_use]
    pub fn period(&self) -> Duration {
        self.inner.period
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // No user code runs under this lock.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

pin_project! {
    /// The future of [`TickLimiter::wait`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped before its slot, it gives the slot back (when no later caller
    /// took the slot after it).
    #[must_use = "futures do nothing unless polled"]
    pub struct TickWait<'a> {
        limiter: &'a TickLimiter,
        token: &'a CancellationToken,
        // The slot taken and not yet used.
        slot: Option<Instant>,
        started: bool,
        done: bool,
        #[pin]
        closed: Notified<'a>,
        #[pin]
        sleep: Option<Sleep>,
        #[pin]
        cancelled: Option<WaitForCancellationFuture<'a>>,
    }

    impl<'a> PinnedDrop for TickWait<'a> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(slot) = this.slot.take() {
                this.limiter.give_back(slot);
            }
        }
    }
}

impl Future for TickWait<'_> {
    type Output = Result<(), WaitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        assert!(!*this.done, "a wait polled after completion");
        if !*this.started {
            *this.started = true;
            // A cancellation observed before the slot is taken wins: no slot is taken.
            if this.token.is_cancelled() {
                *this.done = true;
                return Poll::Ready(Err(WaitError::Cancelled));
            }
            // Registered before the closed flag is read: a close in between is not missed.
            this.closed.as_mut().enable();
            let limiter = *this.limiter;
            let mut state = limiter.state();
            if state.closed {
                *this.done = true;
                return Poll::Ready(Err(WaitError::Closed));
            }
            let slot = state.next.max(Instant::now());
            state.next = after(slot, limiter.inner.period);
            drop(state);
            *this.slot = Some(slot);
            this.sleep.set(Some(tokio::time::sleep_until(slot)));
            this.cancelled.set(Some(this.token.cancelled()));
        }
        // Token first, then the close, then the slot (as a `biased` select).
        let outcome = if this
            .cancelled
            .as_mut()
            .as_pin_mut()
            .is_some_and(|cancelled| cancelled.poll(cx).is_ready())
        {
            Err(WaitError::Cancelled)
        } else if this.closed.as_mut().poll(cx).is_ready() {
            Err(WaitError::Closed)
        } else if this
            .sleep
            .as_mut()
            .as_pin_mut()
            .is_some_and(|sleep| sleep.poll(cx).is_ready())
        {
            // Used: nothing to give back.
            *this.slot = None;
            Ok(())
        } else {
            return Poll::Pending;
        };
        if let Some(slot) = this.slot.take() {
            this.limiter.give_back(slot);
        }
        *this.done = true;
        Poll::Ready(outcome)
    }
}

impl fmt::Debug for TickWait<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TickWait")
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl TickLimiter {
    /// Gives an unused slot back if it is still the last one handed out.
    fn give_back(&self, slot: Instant) {
        let mut state = self.state();
        if state.next == after(slot, self.inner.period) {
            state.next = slot;
        }
    }
}

/// The slot one period after `slot`. A period too long for the clock (`Duration::MAX`)
/// puts the next slot 30 years ahead, which is never in practice: the first wait goes
/// through and later ones wait, instead of an overflow panic.
fn after(slot: Instant, period: Duration) -> Instant {
    slot.checked_add(period)
        .unwrap_or_else(|| slot + Duration::from_secs(60 * 60 * 24 * 365 * 30))
}

impl fmt::Debug for TickLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TickLimiter")
            .field("period", &self.inner.period)
            .field("closed", &self.is_closed())
            .finish()
    }
}
