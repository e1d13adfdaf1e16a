//! `Reservation`: tokens taken by `RateLimiter::reserve_n`, and the calls that take them.

use std::fmt;
use std::time::Duration;

use super::RateLimiter;
use crate::CheckError;
use crate::gcra::nanos;

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
    delay: Duration,
    /// The interval the tokens were taken at.
    interval: u64,
}

impl RateLimiter {
    /// Takes one token now or in the future; see [`reserve_n`](Self::reserve_n).
    ///
    /// Never fails: in the one case where [`reserve_n`](Self::reserve_n) would (the bucket
    /// already reserved beyond the clock's range, about 584 years ahead), the reservation
    /// holds no token and is never due ([`delay`](Reservation::delay) is `Duration::MAX`).
    #[must_use = "a reservation takes a token; cancel it to give it back"]
    pub fn reserve(&self) -> Reservation {
        self.reserve_n(1).unwrap_or_else(|_| Reservation {
            limiter: self.clone(),
            tokens: 0,
            due: self.inner.clock.instant(u64::MAX),
            due_at: u64::MAX,
            delay: Duration::MAX,
            interval: self.rate().interval,
        })
    }

    /// Takes `n` tokens now or in the future: the reservation says how long until they are
    /// due ([`Reservation::delay`]); act then, or [`cancel`](Reservation::cancel) it to give
    /// the tokens back. Later callers queue behind the reservation.
    ///
    /// # Errors
    ///
    /// [`CheckError::ExceedsBurst`] when `n` is more than the burst, or
    /// `CheckError::NotYet { wait: Duration::MAX }` when the bucket is already reserved beyond
    /// the clock's range (about 584 years ahead: reservations on a very slow quota).
    pub fn reserve_n(&self, n: u32) -> Result<Reservation, CheckError> {
        self.reserve_within(n, Duration::MAX)
    }

    /// Like [`reserve_n`](Self::reserve_n), but takes nothing when the tokens would be due
    /// later than `max_wait` from now (x/time/rate's `ReserveN` with a maximum future
    /// reservation): `CheckError::NotYet` then says how long it would have been.
    ///
    /// # Errors
    ///
    /// [`CheckError::ExceedsBurst`], or [`CheckError::NotYet`] (nothing taken).
    pub fn reserve_within(&self, n: u32, max_wait: Duration) -> Result<Reservation, CheckError> {
        let mut books = self.books();
        let rate = self.rate();
        if n > rate.burst {
            return Err(CheckError::ExceedsBurst {
                requested: n,
                burst: rate.burst,
            });
        }
        let now = self.inner.clock.now();
        let Some(delay) = self.inner.tat.reserve(now, n, rate, nanos(max_wait)) else {
            let wait = match rate.reserve(self.inner.tat.load(), now, n, u64::MAX) {
                Some((_, delay)) => Duration::from_nanos(delay),
                None => Duration::MAX,
            };
            return Err(CheckError::NotYet { wait });
        };
        let due = now.saturating_add(delay);
        books.last_due = books.last_due.max(due);
        Ok(Reservation {
            limiter: self.clone(),
            tokens: n,
            due: self.inner.clock.instant(due),
            due_at: due,
            delay: Duration::from_nanos(delay),
            interval: rate.interval,
        })
    }
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

    /// How many tokens it holds.
    #[must_use]
    pub fn tokens(&self) -> u32 {
        self.tokens
    }

    /// Waits until the tokens are due.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the reservation is unchanged.
    pub async fn ready(&self) {
        tokio::time::sleep_until(self.due).await;
    }

    /// Gives back the tokens that are still in the future, as x/time/rate's
    /// `Reservation.Cancel`: nothing once the due time has passed (at the due instant itself
    /// they still come back); otherwise the tokens not already reserved by later callers
    /// (whose due times stay as they were), counted at the rate they were taken at and given
    /// back at today's rate (so a `set_interval` in between refunds what those tokens are
    /// worth now), never more than the burst.
    pub fn cancel(self) {
        let limiter = &self.limiter;
        let mut books = limiter.books();
        let now = limiter.inner.clock.now();
        if self.due_at < now {
            return;
        }
        let cost = u128::from(self.interval) * u128::from(self.tokens);
        // Reserved after this one, in time at this one's interval.
        let after = u128::from(books.last_due.saturating_sub(self.due_at));
        let refund = cost.saturating_sub(after);
        if refund == 0 {
            return;
        }
        let interval_now = u128::from(limiter.rate().interval);
        let refund_now = refund * interval_now / u128::from(self.interval.max(1));
        limiter
            .inner
            .tat
            .refund(now, u64::try_from(refund_now).unwrap_or(u64::MAX));
        if books.last_due == self.due_at {
            // This was the latest: the one before it is now (if it is still ahead).
            let before = u64::try_from(u128::from(self.due_at).saturating_sub(cost)).unwrap_or(0);
            if before >= now {
                books.last_due = before;
            }
        }
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
