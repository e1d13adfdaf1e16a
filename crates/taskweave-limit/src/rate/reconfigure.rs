//! Live reconfiguration of a `RateLimiter`: `set_quota`, `set_interval`, `set_rate`, `set_burst`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Books, RateLimiter};
use crate::Quota;
use crate::gcra::Rate;

impl RateLimiter {
    /// Changes the rate and the burst of a live limiter; see [`set_interval`](Self::set_interval)
    /// and [`set_burst`](Self::set_burst).
    pub fn set_quota(&self, quota: Quota) {
        let mut books = self.books();
        self.change(&mut books, quota.interval(), quota.burst());
    }

    /// Changes the time between two tokens of a live limiter (any rate, fractional ones
    /// included). The tokens available stay what they were (a drained bucket stays drained
    /// and refills at the new rate: its state is rescaled, not reset), as x/time/rate's
    /// `SetLimit`. Callers already sleeping on a delay computed at the old rate wake at that
    /// time and check again.
    ///
    /// # Panics
    ///
    /// Panics if `interval` is zero.
    pub fn set_interval(&self, interval: Duration) {
        assert!(
            !interval.is_zero(),
            "RateLimiter::set_interval: the interval must be greater than zero"
        );
        let mut books = self.books();
        let burst = self.rate().burst;
        self.change(&mut books, interval, burst);
    }

    /// [`set_interval`](Self::set_interval) for `per_second` tokens a second.
    ///
    /// # Panics
    ///
    /// Panics if `per_second` is zero or above 10⁹.
    pub fn set_rate(&self, per_second: u32) {
        let interval = Quota::per_second(per_second).interval();
        self.set_interval(interval);
    }

    /// Changes the burst of a live limiter. The tokens available now stay what they were
    /// (x/time/rate's `SetBurst`): raising the burst frees nothing at once, the bucket just
    /// fills higher; lowering it caps what is available at the new burst. A check racing the
    /// change on another thread may still be decided on the old settings (one grant beyond
    /// the new cap per such check, paid back by later callers).
    ///
    /// # Panics
    ///
    /// Panics if `burst` is zero.
    pub fn set_burst(&self, burst: u32) {
        assert!(
            burst > 0,
            "RateLimiter::set_burst: burst must be greater than zero"
        );
        let mut books = self.books();
        let asked = books.asked;
        self.change(&mut books, asked, burst);
    }

    /// Applies new settings under the books' lock: the rescale for the interval first, then
    /// the shift for the burst, then the settings themselves.
    fn change(&self, books: &mut Books, interval: Duration, burst: u32) {
        let old = self.rate();
        let new = Rate::new(interval, burst);
        let now = self.inner.clock.now();
        books.asked = interval;
        if new.interval != old.interval {
            self.inner.tat.rescale(now, old.interval, new.interval);
            self.inner.interval.store(new.interval, Ordering::Relaxed);
        }
        if new.burst != old.burst {
            self.inner
                .tat
                .reburst(now, new.interval, old.burst, new.burst);
            self.inner.burst.store(new.burst, Ordering::Relaxed);
        }
    }
}
