//! `RateLimiter`: a token bucket (GCRA) with wait, allow, reserve, and live reconfiguration.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::gcra::{Clock, ClockChoice, Decision, Tat, nanos};
use crate::{CheckError, WaitError};

/// A token bucket: `burst` tokens, refilled at `rate` per second.
///
/// - [`allow`](Self::allow) / [`check_n`](Self::check_n) never wait.
/// - [`wait`](Self::wait) / [`wait_n`](Self::wait_n) wait for the tokens or the caller's
///   token; a cancelled wait consumes nothing.
/// - [`reserve`](Self::reserve) takes tokens now or in the future and says how long until
///   they are due; [`Reservation::cancel`] gives them back (Go's `Reserve`).
/// - A request for more tokens than the burst is an error at once, never a wait for ever.
/// - [`set_rate`](Self::set_rate) and [`set_burst`](Self::set_burst) change a live limiter
///   without resetting it.
///
/// Time follows tokio's: with `start_paused` tests the limiter follows the paused clock.
///
/// # Comparison to governor
///
/// The algorithm is governor's (GCRA, one atomic per bucket). This type is written here
/// rather than wrapped around governor because governor keeps its state private: a
/// reservation that can be given back and a rate change that keeps the tokens owed both need
/// it.
///
/// The clock is chosen at the limiter's first use. Where tokio's clock runs in real time
/// (production, or outside a runtime), the limiter reads the CPU's time-stamp counter through
/// `quanta`, as governor does, and `allow` costs what governor's `check` costs. Where tokio's
/// clock is paused (`#[tokio::test(start_paused = true)]`), it reads tokio's clock instead, so
/// tests drive it with `advance` and auto-advance, which governor's default clock ignores.
/// [`with_tokio_clock`](Self::with_tokio_clock) and [`with_fast_clock`](Self::with_fast_clock)
/// make the choice explicit, for a limiter first used before a test calls
/// `tokio::time::pause()`. The first time-stamp-counter limiter of a process calibrates the
/// counter (quanta: 0.5 ms at least, 200 ms at most, once). See `docs/benchmarks.md` for the
/// figures.
///
/// Waiters are not queued: a [`wait_n`](Self::wait_n) for many tokens checks again when they
/// are due and can be overtaken by callers taking one token at a time. Use
/// [`reserve_n`](Self::reserve_n) to hold a place.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_limit::RateLimiter;
/// use tokio::time::Instant;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let limiter = RateLimiter::new(10, 2); // 10 per second, bursts of 2
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
    /// Chosen at the first use (`Clock::auto`), or earlier by `with_fast_clock` or
    /// `with_tokio_clock`.
    clock: ClockChoice,
    tat: Tat,
    /// Nanoseconds per token.
    interval: AtomicU64,
    burst: AtomicU32,
}

impl Inner {}

impl RateLimiter {
    /// `per_second` tokens per second, at most `burst` at once.
    ///
    /// # Panics
    ///
    /// Panics if `per_second` or `burst` is zero, or `per_second` is above 10⁹ (the clock
    /// counts nanoseconds).
    #[must_use]
    pub fn new(per_second: u32, burst: u32) -> Self {
        assert!(
            per_second > 0,
            "RateLimiter::new: rate must be greater than zero"
        );
        assert!(
            per_second <= 1_000_000_000,
            "RateLimiter::new: rate must be at most 1,000,000,000 per second"
        );
        Self::with_interval(Duration::from_secs(1) / per_second, burst)
    }

    /// One token every `interval`, at most `burst` at once.
    ///
    /// # Panics
    ///
    /// Panics if `interval` or `burst` is zero.
    #[must_use]
    pub fn with_interval(interval: Duration, burst: u32) -> Self {
        assert!(
            !interval.is_zero(),
            "RateLimiter: interval must be greater than zero"
        );
        assert!(burst > 0, "RateLimiter: burst must be greater than zero");
        RateLimiter {
            inner: Arc::new(Inner {
                clock: ClockChoice::default(),
                tat: Tat::default(),
                interval: AtomicU64::new(nanos(interval)),
                burst: AtomicU32::new(burst),
            }),
        }
    }

    /// Reads time from the CPU's time-stamp counter (through `quanta`, as governor does),
    /// even where tokio's clock is paused at the first use. The limiter then no
    /// longer follows tokio's paused clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_limit::RateLimiter;
    ///
    /// let limiter = RateLimiter::new(1_000, 10).with_fast_clock();
    /// assert!(limiter.allow());
    /// ```
    ///
    /// # Panics
    ///
    /// Panics if the limiter was already used: choose the clock right after construction.
    #[must_use]
    pub fn with_fast_clock(self) -> Self {
        self.inner
            .clock
            .choose(Clock::fast(), "RateLimiter::with_fast_clock");
        self
    }

    /// Reads time from tokio's clock (`tokio::time::Instant`), even where it runs in real time
    /// at the first use: for a limiter used before a test calls `tokio::time::pause()`. Each check
    /// then costs one more system clock read (about 20 ns) than on the time-stamp counter.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskweave_limit::RateLimiter;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(10, 1).with_tokio_clock();
    /// tokio::time::pause();
    /// assert!(limiter.allow());
    /// assert!(!limiter.allow());
    /// tokio::time::advance(Duration::from_millis(100)).await;
    /// assert!(limiter.allow());
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics if the limiter was already used: choose the clock right after construction.
    #[must_use]
    pub fn with_tokio_clock(self) -> Self {
        self.inner
            .clock
            .choose(Clock::tokio(), "RateLimiter::with_tokio_clock");
        self
    }

    /// Takes one token if there is one.
    #[must_use]
    pub fn allow(&self) -> bool {
        self.check_n(1).is_ok()
    }

    /// Takes `n` tokens if they are all there.
    ///
    /// # Errors
    ///
    /// [`CheckError::NotYet`] with the time until they would be, or
    /// [`CheckError::ExceedsBurst`] when `n` is more than the burst.
    pub fn check_n(&self, n: u32) -> Result<(), CheckError> {
        let (interval, burst) = self.settings();
        if n > burst {
            return Err(CheckError::ExceedsBurst {
                requested: n,
                burst,
            });
        }
        match self
            .inner
            .tat
            .check(self.inner.clock.get().now(), n, interval, burst)
        {
            Decision::Granted => Ok(()),
            Decision::NotYet(wait) => Err(CheckError::NotYet {
                wait: Duration::from_nanos(wait),
            }),
        }
    }

    /// Waits for one token, unless `token` is cancelled first.
    ///
    /// # Errors
    ///
    /// [`WaitError::Cancelled`]; no token is consumed then.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a token is consumed only when the future completes with `Ok`.
    pub async fn wait(&self, token: &CancellationToken) -> Result<(), WaitError> {
        self.wait_n(token, 1).await
    }

    /// Waits for `n` tokens at once, unless `token` is cancelled first.
    ///
    /// # Errors
    ///
    /// [`WaitError::Cancelled`] (nothing consumed), or [`WaitError::ExceedsBurst`] at once.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`wait`](Self::wait).
    pub async fn wait_n(&self, token: &CancellationToken, n: u32) -> Result<(), WaitError> {
        loop {
            let wait = match self.check_n(n) {
                Ok(()) => return Ok(()),
                Err(CheckError::ExceedsBurst { requested, burst }) => {
                    return Err(WaitError::ExceedsBurst { requested, burst });
                }
                Err(CheckError::NotYet { wait }) => wait,
            };
            tokio::select! {
                biased;
                () = token.cancelled() => return Err(WaitError::Cancelled),
                // Someone else may take the tokens first: check again when they are due.
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Takes one token now or in the future; see [`reserve_n`](Self::reserve_n).
    #[must_use = "a reservation takes a token; cancel it to give it back"]
    pub fn reserve(&self) -> Reservation {
        match self.reserve_n(1) {
            Ok(reservation) => reservation,
            // The burst is at least 1.
            Err(_) => unreachable!("a burst is never zero"),
        }
    }

    /// Takes `n` tokens now or in the future: the reservation says how long until they are
    /// due ([`Reservation::delay`]); act then, or [`cancel`](Reservation::cancel) it to give
    /// the tokens back. Later callers queue behind the reservation.
    ///
    /// # Errors
    ///
    /// [`CheckError::ExceedsBurst`] when `n` is more than the burst.
    pub fn reserve_n(&self, n: u32) -> Result<Reservation, CheckError> {
        let (interval, burst) = self.settings();
        if n > burst {
            return Err(CheckError::ExceedsBurst {
                requested: n,
                burst,
            });
        }
        let now = self.inner.clock.get().now();
        let (delay, reserved_tat) = self.inner.tat.reserve(now, n, interval, burst);
        let due = now.saturating_add(delay);
        Ok(Reservation {
            limiter: self.clone(),
            tokens: n,
            due: self.inner.clock.get().instant(due),
            due_at: due,
            reserved_tat,
            delay: Duration::from_nanos(delay),
            interval,
        })
    }

    /// Changes the rate of a live limiter. The tokens owed stay owed: a drained bucket stays
    /// drained and refills at the new rate (its state is rescaled, not reset). Callers already
    /// sleeping on a delay computed at the old rate wake at that time and check again.
    ///
    /// # Panics
    ///
    /// Panics if `per_second` is zero or above 10⁹.
    pub fn set_rate(&self, per_second: u32) {
        assert!(
            per_second > 0,
            "RateLimiter::set_rate: rate must be greater than zero"
        );
        assert!(
            per_second <= 1_000_000_000,
            "RateLimiter::set_rate: rate must be at most 1,000,000,000 per second"
        );
        let new = nanos(Duration::from_secs(1) / per_second);
        let old = self.inner.interval.swap(new, Ordering::Relaxed);
        self.inner
            .tat
            .rescale(self.inner.clock.get().now(), old, new);
    }

    /// Changes the burst of a live limiter.
    ///
    /// # Panics
    ///
    /// Panics if `burst` is zero.
    pub fn set_burst(&self, burst: u32) {
        assert!(
            burst > 0,
            "RateLimiter::set_burst: burst must be greater than zero"
        );
        self.inner.burst.store(burst, Ordering::Relaxed);
    }

    /// The current burst.
    #[must_use]
    pub fn burst(&self) -> u32 {
        self.inner.burst.load(Ordering::Relaxed)
    }

    /// The current time between two tokens.
    #[must_use]
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.inner.interval.load(Ordering::Relaxed))
    }

    /// Tokens available now (what `check_n` would grant).
    #[must_use]
    pub fn available(&self) -> u32 {
        let (interval, burst) = self.settings();
        let now = self.inner.clock.get().now();
        let horizon = now.saturating_add(interval.saturating_mul(u64::from(burst)));
        let tat = self.inner.tat.load().max(now);
        u32::try_from(horizon.saturating_sub(tat) / interval).unwrap_or(u32::MAX)
    }

    // Relaxed: the two settings are read independently; a request that sees a new rate with
    // an old burst (or the reverse) during a reconfiguration is acceptable.
    fn settings(&self) -> (u64, u32) {
        (
            self.inner.interval.load(Ordering::Relaxed),
            self.inner.burst.load(Ordering::Relaxed),
        )
    }
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("interval", &self.interval())
            .field("burst", &self.burst())
            .field("available", &self.available())
            .finish()
    }
}

/// Tokens taken by [`RateLimiter::reserve_n`], due after [`delay`](Self::delay).
///
/// Dropping it keeps the tokens taken; [`cancel`](Self::cancel) gives back what is still in
/// the future.
#[must_use = "a reservation takes tokens; cancel it to give them back"]
pub struct Reservation {
    limiter: RateLimiter,
    tokens: u32,
    due: tokio::time::Instant,
    due_at: u64,
    reserved_tat: u64,
    delay: Duration,
    interval: u64,
}

impl Reservation {
    /// How long after the reservation the tokens were due (zero: at once).
    #[must_use]
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// When the tokens are due.
    #[must_use]
    pub fn due(&self) -> tokio::time::Instant {
        self.due
    }

    /// Waits until the tokens are due.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the reservation is unchanged.
    pub async fn ready(&self) {
        tokio::time::sleep_until(self.due).await;
    }

    /// Gives back the tokens that are still in the future, as Go's `Reservation.Cancel` does:
    /// nothing once they are due; otherwise the tokens not already reserved by later callers
    /// (whose due times stay as they were), to whoever asks next.
    pub fn cancel(self) {
        let inner = &self.limiter.inner;
        inner.tat.cancel(
            inner.clock.get().now(),
            self.tokens,
            self.interval,
            self.reserved_tat,
            self.due_at,
        );
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("tokens", &self.tokens)
            .field("delay", &self.delay)
            .finish()
    }
}
