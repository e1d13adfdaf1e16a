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

/// The state of a wait that needs no pinning.
#[derive(Debug)]
struct Engine {
    n: u32,
    max_wait: Option<Duration>,
    deadline: Option<Instant>,
    started: bool,
    done: bool,
}

impl Engine {
    fn new(n: u32, max_wait: Option<Duration>) -> Self {
        Engine {
            n,
            max_wait,
            deadline: None,
            started: false,
            done: false,
        }
    }

    /// Token first (a cancellation observed before the tokens are taken wins), then the
    /// check; `NotYet` sleeps until the tokens would be there and checks again (another
    /// caller may take them first).
    fn poll<'a>(
        &mut self,
        token: &'a CancellationToken,
        check: impl Fn(u32) -> Result<(), CheckError>,
        mut sleep: Pin<&mut Option<Sleep>>,
        mut cancelled: Pin<&mut Option<WaitForCancellationFuture<'a>>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), WaitError>> {
        assert!(!self.done, "a wait polled after completion");
        if !self.started {
            self.started = true;
            if token.is_cancelled() {
                return self.finish(Err(WaitError::Cancelled));
            }
            self.deadline = self.max_wait.map(|max| later(Instant::now(), max));
        }
        loop {
            if let Some(cancelled) = cancelled.as_mut().as_pin_mut()
                && cancelled.poll(cx).is_ready()
            {
                return self.finish(Err(WaitError::Cancelled));
            }
            if let Some(sleep) = sleep.as_mut().as_pin_mut()
                && sleep.poll(cx).is_pending()
            {
                return Poll::Pending;
            }
            let wait = match check(self.n) {
                Ok(()) => return self.finish(Ok(())),
                Err(CheckError::ExceedsBurst { requested, burst }) => {
                    return self.finish(Err(WaitError::ExceedsBurst { requested, burst }));
                }
                Err(CheckError::NotYet { wait }) => wait,
            };
            let at = later(Instant::now(), wait);
            if self.deadline.is_some_and(|deadline| at > deadline) {
                return self.finish(Err(WaitError::WouldExceedDeadline { wait }));
            }
            match sleep.as_mut().as_pin_mut() {
                Some(sleep) => sleep.reset(at),
                None => sleep.set(Some(tokio::time::sleep_until(at))),
            }
            if cancelled.is_none() {
                cancelled.set(Some(token.cancelled()));
            }
        }
    }

    fn finish(&mut self, outcome: Result<(), WaitError>) -> Poll<Result<(), WaitError>> {
        self.done = true;
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
        token: &'a CancellationToken,
        engine: Engine,
        #[pin]
        sleep: Option<Sleep>,
        #[pin]
        cancelled: Option<WaitForCancellationFuture<'a>>,
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
            token,
            engine: Engine::new(n, max_wait),
            sleep: None,
            cancelled: None,
        }
    }
}

impl Future for Wait<'_> {
    type Output = Result<(), WaitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let limiter = *this.limiter;
        this.engine.poll(
            this.token,
            |n| limiter.check_n(n),
            this.sleep,
            this.cancelled,
            cx,
        )
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
        token: &'a CancellationToken,
        engine: Engine,
        #[pin]
        sleep: Option<Sleep>,
        #[pin]
        cancelled: Option<WaitForCancellationFuture<'a>>,
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
            token,
            engine: Engine::new(n, None),
            sleep: None,
            cancelled: None,
        }
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Future for KeyedWait<'_, K> {
    type Output = Result<(), WaitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (limiter, key) = (*this.limiter, *this.key);
        this.engine.poll(
            this.token,
            |n| limiter.check_n(key, n),
            this.sleep,
            this.cancelled,
            cx,
        )
    }
}

impl<K> fmt::Debug for KeyedWait<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedWait")
            .field("tokens", &self.engine.n)
            .finish_non_exhaustive()
    }
}
