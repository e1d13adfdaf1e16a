//! `Quota`: a rate and a burst, as one value.

use std::fmt;
use std::time::Duration;

/// How many tokens a limiter hands out: one every [`interval`](Self::interval), at most
/// [`burst`](Self::burst) at once. Built from a rate (`per_second(50)`) or a period
/// (`every(Duration::from_secs(2))`, a fractional rate), with the burst set by
/// [`with_burst`](Self::with_burst).
///
/// As governor's `Quota`, a rate per unit allows a burst of that many by default; a period
/// allows a burst of 1. With the `governor` feature, a `governor::Quota` converts into one
/// unchanged (`Quota::from(governor_quota)`).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_limit::Quota;
///
/// let api = Quota::per_second(50).with_burst(5);
/// assert_eq!((api.interval(), api.burst()), (Duration::from_millis(20), 5));
///
/// let slow = Quota::every(Duration::from_secs(2)); // half a token a second
/// assert_eq!(slow.burst(), 1);
/// assert_eq!(Quota::per_minute(6).interval(), Duration::from_secs(10));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    interval: Duration,
    burst: u32,
}

impl Quota {
    /// `per_second` tokens a second, in bursts of as many.
    ///
    /// # Panics
    ///
    /// Panics if `per_second` is zero or above 10⁹ (the clock counts nanoseconds).
    #[must_use]
    pub fn per_second(per_second: u32) -> Self {
        Self::per(per_second, Duration::from_secs(1), "Quota::per_second")
    }

    /// `per_minute` tokens a minute, in bursts of as many.
    ///
    /// # Panics
    ///
    /// Panics if `per_minute` is zero.
    #[must_use]
    pub fn per_minute(per_minute: u32) -> Self {
        Self::per(per_minute, Duration::from_secs(60), "Quota::per_minute")
    }

    /// `per_hour` tokens an hour, in bursts of as many.
    ///
    /// # Panics
    ///
    /// Panics if `per_hour` is zero.
    #[must_use]
    pub fn per_hour(per_hour: u32) -> Self {
        Self::per(per_hour, Duration::from_secs(3600), "Quota::per_hour")
    }

    /// One token every `interval`, in bursts of 1: any rate, fractional ones included.
    /// An interval longer than 2⁶² ns divided by the burst (146 years at a burst of 1) is
    /// kept at that: the burst goes through, then nothing for decades.
    ///
    /// # Panics
    ///
    /// Panics if `interval` is zero.
    #[must_use]
    pub fn every(interval: Duration) -> Self {
        assert!(
            !interval.is_zero(),
            "Quota::every: the interval must be greater than zero"
        );
        Quota { interval, burst: 1 }
    }

    #[track_caller]
    fn per(count: u32, unit: Duration, what: &str) -> Self {
        assert!(count > 0, "{what}: the rate must be greater than zero");
        let interval = unit / count;
        assert!(
            !interval.is_zero(),
            "{what}: the rate must be at most one token per nanosecond"
        );
        Quota {
            interval,
            burst: count,
        }
    }

    /// The same rate with bursts of `burst`.
    ///
    /// # Panics
    ///
    /// Panics if `burst` is zero.
    #[must_use]
    pub fn with_burst(self, burst: u32) -> Self {
        assert!(
            burst > 0,
            "Quota::with_burst: the burst must be greater than zero"
        );
        Quota { burst, ..self }
    }

    /// The time between two tokens.
    #[must_use]
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The most tokens at once.
    #[must_use]
    pub fn burst(&self) -> u32 {
        self.burst
    }
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quota")
            .field("interval", &self.interval)
            .field("burst", &self.burst)
            .finish()
    }
}

/// governor's quota, unchanged: its replenish interval and burst size.
#[cfg(feature = "governor")]
#[cfg_attr(docsrs, doc(cfg(feature = "governor")))]
impl From<governor::Quota> for Quota {
    fn from(quota: governor::Quota) -> Self {
        Quota {
            interval: quota.replenish_interval(),
            burst: quota.burst_size().get(),
        }
    }
}
