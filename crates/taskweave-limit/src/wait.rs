//! The named wait futures of the token buckets: `Wait` (a `RateLimiter`) and `KeyedWait`
//! (a key of a `KeyedRateLimiter`).

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::{CheckError, KeyedRateLimiter, RateLimiter, WaitError};

pin_project! {
    /// One wait: its settings, its sleep and the token's cancellation future (both made only
    /// when the wait first sleeps).
    struct Engine<'a> {
        token: &'a CancellationToken,
        n: u32,
        max_wait: Option<Duration>,
        deadline: Option<Instant>,
        started: bool,
        done: bool,
        #[pin]
        sleep: Option<Sleep>,
        #[pin]
        cancelled: Option<WaitForCancellationFuture<'a>>,
    }
}

impl<'a> Engine<'a> {
    fn new(token: &'a CancellationToken, n: u32, max_wait: Option<Duration>) -> Self {
        Engine {
            token,
            n,
            max_wait,
            deadline: None,
            started: false,
            done: false,
            sleep: None,
            cancelled: None,
        }
    }

    /// Token first (a cancellation observed before the tokens are taken wins), then the
    /// check; `NotYet` sleeps until the tokens would be there and checks again (another
    /// caller may take them first).
    fn poll(
        self: Pin<&mut Self>,
        check: impl Fn(u32) -> Result<(), CheckError>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), WaitError>> {
        let mut this = self.project();
        assert!(!*this.done, "a wait polled after completion");
        let token: &'a CancellationToken = this.token;
        let outcome = loop {
            if !*this.started {
                *this.started = true;
                if token.is_cancelled() {
                    break Err(WaitError::Cancelled);
                }
                *this.deadline = this.max_wait.map(|max| later(Instant::now(), max));
            }
            if let Some(cancelled) = this.cancelled.as_mut().as_pin_mut()
                && cancelled.poll(cx).is_ready()
            {
                break Err(WaitError::Cancelled);
            }
            if let Some(sleep) = this.sleep.as_mut().as_pin_mut()
                && sleep.poll(cx).is_pending()
            {
                return Poll::Pending;
            }
            let wait = match check(*this.n) {
                Ok(()) => break Ok(()),
                Err(CheckError::ExceedsBurst { requested, burst }) => {
                    break Err(WaitError::ExceedsBurst { requested, burst });
                }
                Err(CheckError::NotYet { wait }) => wait,
            };
            let at = later(Instant::now(), wait);
            if this.deadline.is_some_and(|deadline| at > deadline) {
                break Err(WaitError::WouldExceedDeadline { wait });
            }
            match this.sleep.as_mut().as_pin_mut() {
                Some(sleep) => sleep.reset(at),
                None => this.sleep.set(Some(tokio::time::sleep_until(at))),
            }
            if this.cancelled.is_none() {
                this.cancelled.set(Some(token.cancelled()));
            }
        };
        *this.done = true;
        Poll::Ready(outcome)
    }
}

/// `at + by`, or 30 years ahead when that does not fit the clock.
fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by)
        .unwrap_or_else(|| at + Duration::from_secs(60 * 60 * 24 * 365 * 30))
}

pin_project! {
    /// The future of [`RateLimiter::wait`], [`wait_n`](RateLimiter::wait_n) and
    /// [`wait_n_within`](RateLimiter::wait_n_within).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: tokens are taken only when it completes with `Ok`.
    #[must_use = "futures do nothing unless polled"]
    pub struct Wait<'a> {
        limiter: &'a RateLimiter,
        #[pin]
        engine: Engine<'a>,
    }
}

impl<'a> Wait<'a> {
    pub(crate) fn new(
        limiter: &'a RateLimiter,
        token: &'a CancellationToken,
        n: u32,
        max_wait: Option<Duration>,
    ) -> Self {
        Wait {
            limiter,
            engine: Engine::new(token, n, max_wait),
        }
    }
}

impl Future for Wait<'_> {
    type Output = Result<(), WaitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let limiter = *this.limiter;
        this.engine.poll(|n| limiter.check_n(n), cx)
    }
}

impl fmt::Debug for Wait<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wait")
            .field("tokens", &self.engine.n)
            .field("max_wait", &self.engine.max_wait)
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The future of [`KeyedRateLimiter::wait`] and [`wait_n`](KeyedRateLimiter::wait_n).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: tokens are taken only when it completes with `Ok`.
    #[must_use = "futures do nothing unless polled"]
    pub struct KeyedWait<'a, K> {
        limiter: &'a KeyedRateLimiter<K>,
        key: &'a K,
        #[pin]
        engine: Engine<'a>,
    }
}

impl<'a, K> KeyedWait<'a, K> {
    pub(crate) fn new(
        limiter: &'a KeyedRateLimiter<K>,
        token: &'a CancellationToken,
        key: &'a K,
        n: u32,
    ) -> Self {
        KeyedWait {
            limiter,
            key,
            engine: Engine::new(token, n, None),
        }
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Future for KeyedWait<'_, K> {
    type Output = Result<(), WaitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (limiter, key) = (*this.limiter, *this.key);
        this.engine.poll(|n| limiter.check_n(key, n), cx)
    }
}

impl<K> fmt::Debug for KeyedWait<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedWait")
            .field("tokens", &self.engine.n)
            .finish_non_exhaustive()
    }
}
