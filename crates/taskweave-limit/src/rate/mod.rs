//! `RateLimiter`: a token bucket (GCRA) with wait, allow, reserve, and live reconfiguration.

mod reconfigure;
mod reservation;

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::gcra::{Clock, Decision, Rate, Tat};
use crate::{CheckError, Quota, Wait};

pub use reservation::Reservation;

/// A token bucket: [`Quota::burst`] tokens, one more every [`Quota::interval`].
///
/// - [`allow`](Self::allow) / [`allow_n`](Self::allow_n) / [`check_n`](Self::check_n) never
///   wait.
/// - [`wait`](Self::wait) / [`wait_n`](Self::wait_n) wait for the tokens or the caller's
///   token; a token already cancelled gets [`WaitError::Cancelled`](crate::WaitError::Cancelled) even with tokens free,
///   and a cancelled wait takes nothing. [`wait_n_within`](Self::wait_n_within) fails at once
///   when the wait would be longer than allowed (Go's `WaitN` with a context deadline).
/// - [`reserve`](Self::reserve) takes tokens now or in the future and says how long until
///   they are due; [`Reservation::cancel`] gives them back (Go's `Reserve`, with
///   x/time/rate's refund rules); [`reserve_within`](Self::reserve_within) takes nothing
///   when they would be due too late.
/// - A request for more tokens than the burst is an error at once, never a wait for ever.
/// - [`set_quota`](Self::set_quota), [`set_interval`](Self::set_interval),
///   [`set_rate`](Self::set_rate) and [`set_burst`](Self::set_burst) change a live limiter
///   without resetting it (x/time/rate's `SetLimit` and `SetBurst`: the tokens available stay
///   what they were).
///
/// # The clock
///
/// A limiter reads the CPU's time-stamp counter (through `quanta`, as governor does) unless
/// it was built with [`with_tokio_clock`](Self::with_tokio_clock), whatever the runtime and
/// whenever it is first used; build it with `with_tokio_clock` to drive it with tokio's
/// paused clock in tests. (On the time-stamp counter, a wait in a paused test sleeps on
/// tokio's timer and checks real time again, so it spins until real time catches up.) The
/// first time-stamp-counter limiter of a process calibrates the counter (quanta: 0.5 ms at
/// least, 200 ms at most, once).
///
/// Waiters are not queued: a [`wait_n`](Self::wait_n) for many tokens checks again when they
/// are due and can be overtaken by callers taking one token at a time. Use
/// [`reserve_n`](Self::reserve_n) to hold a place.
///
/// # Comparison to governor
///
/// The algorithm is governor's (GCRA, one atomic per bucket). This type is written here
/// rather than wrapped around governor because governor keeps its state private and its
/// quota fixed at construction (its issue 273): a reservation that can be given back and a
/// rate change that keeps the tokens owed both need the state. governor stays the peer in
/// the benchmark (`docs/benchmarks.md`), and with the `governor` feature its `Quota` converts
/// into ours.
///
/// | | governor | taskweave |
/// |---|---|---|
/// | check without waiting | `check`, `check_n` | `allow`, `allow_n`, `check_n` (`NotYet` with the wait, `ExceedsBurst`) |
/// | wait | `until_ready` (no cancellation, no deadline) | `wait(&token)`, `wait_n_within` (fails at once past a deadline) |
/// | reserve, and give back | no | `reserve_n`, `reserve_within`, `Reservation::cancel` |
/// | change the rate or burst live | no (quota fixed) | `set_quota`, `set_interval`, `set_burst` |
/// | keyed | `DashMap` / `HashMap` stores, grows until `retain_recent` | bounded keys, evicts idle keys itself |
/// | state stores, jitter, middleware | yes (pluggable stores, `Jitter`, `until_ready_with_jitter`) | no |
/// | paused-clock tests | its own fake clock | tokio's paused clock (`with_tokio_clock`) |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_limit::{Quota, RateLimiter};
/// use tokio::time::Instant;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let limiter = RateLimiter::new(Quota::per_second(10).with_burst(2)).with_tokio_clock();
/// assert!(limiter.allow());
/// assert!(limiter.allow());
/// assert!(!limiter.allow()); // burst spent
///
/// let started = Instant::now();
/// limiter.wait(&CancellationToken::new()).await.unwrap();
/// assert_eq!(started.elapsed(), Duration::from_millis(100));
/// # }
/// ```
#[derive(Clone)]
pub struct RateLimiter {
    inner: Arc<Inner>,
}

struct Inner {
    clock: Clock,
    tat: Tat,
    /// Nanoseconds per token, as used: the interval asked for, shortened if the burst
    /// window would pass `MAX_WINDOW`.
    interval: AtomicU64,
    burst: AtomicU32,
    /// Reservations, cancels and setting changes, one at a time; checks never take it.
    books: Mutex<Books>,
}

struct Books {
    /// The interval asked for (the effective one may be shorter, see `Rate::new`).
    asked: Duration,
    /// When the latest reservation is due (x/time/rate's `lastEvent`): a cancelled
    /// reservation gives back only what was not reserved after it.
    last_due: u64,
}

impl RateLimiter {
    /// A limiter handing out `quota`: `RateLimiter::new(Quota::per_second(50).with_burst(5))`.
    #[must_use]
    pub fn new(quota: Quota) -> Self {
        Self::with_clock(quota, Clock::fast())
    }

    fn with_clock(quota: Quota, clock: Clock) -> Self {
        let rate = Rate::new(quota.interval(), quota.burst());
        RateLimiter {
            inner: Arc::new(Inner {
                clock,
                tat: Tat::default(),
                interval: AtomicU64::new(rate.interval),
                burst: AtomicU32::new(rate.burst),
                books: Mutex::new(Books {
                    asked: quota.interval(),
                    last_due: 0,
                }),
            }),
        }
    }

    /// Reads time from tokio's clock (`tokio::time::Instant`) instead of the time-stamp
    /// counter, so that tokio's paused clock drives the limiter in tests. Each check then costs
    /// one more system clock read (about 20 ns) outside a paused runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskweave_limit::{Quota, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Quota::per_second(10).with_burst(1)).with_tokio_clock();
    /// assert!(limiter.allow());
    /// assert!(!limiter.allow());
    /// tokio::time::advance(Duration::from_millis(100)).await;
    /// assert!(limiter.allow());
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics if the limiter was already cloned or used: choose the clock right after
    /// construction.
    #[must_use]
    #[track_caller]
    pub fn with_tokio_clock(self) -> Self {
        assert!(
            Arc::strong_count(&self.inner) == 1 && self.inner.tat.load() == 0,
            "RateLimiter::with_tokio_clock: choose the clock right after construction"
        );
        // The interval asked for, not the one in use (which may be shortened for the burst):
        // a later `set_burst` recomputes from it, on either clock alike.
        let asked = self.books().asked;
        Self::with_clock(Quota::every(asked).with_burst(self.burst()), Clock::tokio())
    }

    /// Takes one token if there is one.
    #[must_use]
    pub fn allow(&self) -> bool {
        self.check_n(1).is_ok()
    }

    /// Takes `n` tokens if they are all there (`false` too when `n` is above the burst).
    #[must_use]
    pub fn allow_n(&self, n: u32) -> bool {
        self.check_n(n).is_ok()
    }

    /// Takes `n` tokens if they are all there.
    ///
    /// # Errors
    ///
    /// [`CheckError::NotYet`] with the time until they would be, or
    /// [`CheckError::ExceedsBurst`] when `n` is more than the burst.
    pub fn check_n(&self, n: u32) -> Result<(), CheckError> {
        let rate = self.rate();
        if n > rate.burst {
            return Err(CheckError::ExceedsBurst {
                requested: n,
                burst: rate.burst,
            });
        }
        match self.inner.tat.check(self.inner.clock.now(), n, rate) {
            Decision::Granted => Ok(()),
            Decision::NotYet(wait) => Err(CheckError::NotYet {
                wait: Duration::from_nanos(wait),
            }),
        }
    }

    /// Waits for one token, unless `token` is cancelled first (also when it already is:
    /// then nothing is taken, even if a token is free).
    ///
    /// # Errors
    ///
    /// [`WaitError::Cancelled`](crate::WaitError::Cancelled); no token is consumed then.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a token is consumed only when the future completes with `Ok`.
    pub fn wait<'a>(&'a self, token: &'a CancellationToken) -> Wait<'a> {
        self.wait_n(token, 1)
    }

    /// Waits for `n` tokens at once, unless `token` is cancelled first.
    ///
    /// # Errors
    ///
    /// [`WaitError::Cancelled`](crate::WaitError::Cancelled) (nothing consumed), or [`WaitError::ExceedsBurst`](crate::WaitError::ExceedsBurst) at once.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`wait`](Self::wait).
    pub fn wait_n<'a>(&'a self, token: &'a CancellationToken, n: u32) -> Wait<'a> {
        Wait::new(self, token, n, None)
    }

    /// Like [`wait_n`](Self::wait_n), but fails at once with
    /// [`WaitError::WouldExceedDeadline`](crate::WaitError::WouldExceedDeadline) (nothing taken) when the tokens would come later
    /// than `max_wait` from the first poll: Go's `WaitN` with a context deadline. A request
    /// with a budget of 50 ms answers "too busy" now instead of after 50 ms.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskweave_limit::{Quota, RateLimiter, WaitError};
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Quota::per_second(1)).with_tokio_clock();
    /// let token = CancellationToken::new();
    /// limiter.wait(&token).await.unwrap(); // the burst of 1
    /// let budget = Duration::from_millis(50);
    /// assert!(matches!(
    ///     limiter.wait_n_within(&token, 1, budget).await,
    ///     Err(WaitError::WouldExceedDeadline { .. })
    /// ));
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`wait_n`](Self::wait_n), and [`WaitError::WouldExceedDeadline`](crate::WaitError::WouldExceedDeadline).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`wait`](Self::wait).
    pub fn wait_n_within<'a>(
        &'a self,
        token: &'a CancellationToken,
        n: u32,
        max_wait: Duration,
    ) -> Wait<'a> {
        Wait::new(self, token, n, Some(max_wait))
    }

    /// The current quota (the interval as used: see [`Quota::every`] for the longest one).
    #[must_use]
    pub fn quota(&self) -> Quota {
        self.rate().quota()
    }

    /// The current burst.
    #[must_use]
    pub fn burst(&self) -> u32 {
        self.rate().burst
    }

    /// The current time between two tokens.
    #[must_use]
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.rate().interval)
    }

    /// Tokens available now (what `check_n` would grant).
    #[must_use]
    pub fn available(&self) -> u32 {
        self.rate()
            .available(self.inner.tat.load(), self.inner.clock.now())
    }

    /// `true` when the limiter reads tokio's clock ([`with_tokio_clock`](Self::with_tokio_clock)).
    #[must_use]
    pub fn uses_tokio_clock(&self) -> bool {
        self.inner.clock.is_tokio()
    }

    // Relaxed: the two settings are read independently. A check that reads them before a
    // reconfiguration and compares-and-swaps the bucket after it is decided on the old
    // settings (a grant the new ones would refuse, paid back by later callers: the
    // documented window of a live change); `Rate::step` refuses a mixture whose sums do not
    // fit rather than granting it.
    fn rate(&self) -> Rate {
        Rate {
            interval: self.inner.interval.load(Ordering::Relaxed),
            burst: self.inner.burst.load(Ordering::Relaxed),
        }
    }

    fn books(&self) -> std::sync::MutexGuard<'_, Books> {
        // Two plain fields, each update complete before the lock is released.
        self.inner
            .books
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("interval", &self.interval())
            .field("burst", &self.burst())
            .field("available", &self.available())
            .field("tokio_clock", &self.uses_tokio_clock())
            .finish()
    }
}
