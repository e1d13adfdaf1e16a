//! The generic cell rate algorithm on an atomic "theoretical arrival time", on tokio's clock.
//!
//! A bucket of `burst` tokens refilled one per `interval` is the same as this: keep the time
//! `tat` at which the bucket would be full again; a request for `n` tokens at `now` is
//! granted when `max(tat, now) + n * interval <= now + burst * interval`, and then moves
//! `tat` there. A `tat` at or before `now` means a full bucket, so forgetting such a state
//! loses nothing (the keyed limiter relies on that to evict).

use std::time::Duration;

#[cfg(all(test, taskweave_loom))]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(all(test, taskweave_loom)))]
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

use crate::Quota;

/// Nanoseconds since the limiter's base instant: on the CPU's time-stamp counter through
/// `quanta` (the default, as governor's: several times cheaper to read than the system
/// clock), or on tokio's clock, chosen explicitly, so that the paused test clock drives it.
#[derive(Clone, Debug)]
pub(crate) struct Clock {
    base: Instant,
    fast: Option<FastClock>,
}

#[derive(Clone, Debug)]
struct FastClock {
    clock: quanta::Clock,
    base: u64,
}

impl Clock {
    pub(crate) fn tokio() -> Self {
        Clock {
            base: Instant::now(),
            fast: None,
        }
    }

    pub(crate) fn fast() -> Self {
        let clock = quanta::Clock::new();
        let base = clock.raw();
        Clock {
            base: Instant::now(),
            fast: Some(FastClock { clock, base }),
        }
    }

    pub(crate) fn is_tokio(&self) -> bool {
        self.fast.is_none()
    }

    pub(crate) fn now(&self) -> u64 {
        match &self.fast {
            None => nanos(Instant::now().saturating_duration_since(self.base)),
            Some(fast) => fast.clock.delta_as_nanos(fast.base, fast.clock.raw()),
        }
    }

    /// The tokio instant of a point on this clock, for sleeping until it.
    pub(crate) fn instant(&self, at: u64) -> Instant {
        let far = Duration::from_secs(60 * 60 * 24 * 365 * 30);
        match &self.fast {
            None => self
                .base
                .checked_add(Duration::from_nanos(at))
                .unwrap_or_else(|| self.base + far),
            Some(_) => {
                let ahead = Duration::from_nanos(at.saturating_sub(self.now()));
                let now = Instant::now();
                now.checked_add(ahead).unwrap_or_else(|| now + far)
            }
        }
    }
}

/// The longest burst window (`interval × burst`) a limiter keeps: 2⁶² ns, about 146 years.
/// A longer interval is shortened to `MAX_WINDOW / burst`: the burst goes through, then
/// nothing for decades, and every sum below stays far from `u64::MAX`.
pub(crate) const MAX_WINDOW: u64 = 1 << 62;

/// A rate as the algorithm uses it: nanoseconds per token, and the burst.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rate {
    pub(crate) interval: u64,
    pub(crate) burst: u32,
}

impl Rate {
    /// `interval` per token (at least 1 ns), shortened so that the window stays within
    /// [`MAX_WINDOW`].
    pub(crate) fn new(interval: Duration, burst: u32) -> Self {
        let burst = burst.max(1);
        let interval = nanos(interval).clamp(1, MAX_WINDOW / u64::from(burst));
        Rate { interval, burst }
    }

    /// The decision for `n` tokens at `now` on a bucket whose state is `tat`: the new state,
    /// or how long until the tokens would be there. In `u128`, so nothing saturates: a sum
    /// that does not fit the state (settings read mid-change) is refused, never granted.
    pub(crate) fn step(self, tat: u64, now: u64, n: u32) -> Result<u64, u64> {
        let (new_tat, horizon) = self.after(tat, now, n);
        if new_tat > horizon {
            return Err(u64::try_from(new_tat - horizon).unwrap_or(u64::MAX));
        }
        u64::try_from(new_tat).map_err(|_| u64::MAX)
    }

    /// Takes `n` tokens now or later: the new state and the delay until they are due, or
    /// `None` when that delay would be more than `max_wait` (or the state cannot hold it).
    pub(crate) fn reserve(self, tat: u64, now: u64, n: u32, max_wait: u64) -> Option<(u64, u64)> {
        let (new_tat, horizon) = self.after(tat, now, n);
        let delay = u64::try_from(new_tat.saturating_sub(horizon)).ok()?;
        if delay > max_wait {
            return None;
        }
        Some((u64::try_from(new_tat).ok()?, delay))
    }

    /// The state after taking `n` tokens at `now` from a bucket at `tat`, and the latest state
    /// a grant may leave (`now` plus the burst window), in `u128`: nothing saturates.
    fn after(self, tat: u64, now: u64, n: u32) -> (u128, u128) {
        let cost = u128::from(self.interval) * u128::from(n);
        let horizon = u128::from(now) + u128::from(self.interval) * u128::from(self.burst);
        (u128::from(tat.max(now)) + cost, horizon)
    }

    /// The quota these settings hand out.
    pub(crate) fn quota(self) -> Quota {
        Quota::every(Duration::from_nanos(self.interval)).with_burst(self.burst)
    }

    /// Tokens free at `now` for a bucket at `tat`.
    pub(crate) fn available(self, tat: u64, now: u64) -> u32 {
        let (full, horizon) = self.after(tat, now, 0);
        let free = horizon.saturating_sub(full) / u128::from(self.interval);
        u32::try_from(free).unwrap_or(u32::MAX)
    }
}

pub(crate) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The outcome of one GCRA step.
pub(crate) enum Decision {
    /// Granted; the new `tat` is stored.
    Granted,
    /// Not granted; the request would fit at `now + wait`.
    NotYet(u64),
}

/// One bucket's state: its theoretical arrival time.
#[derive(Debug, Default)]
pub(crate) struct Tat(AtomicU64);

impl Tat {
    /// Takes `n` tokens if they are there.
    pub(crate) fn check(&self, now: u64, n: u32, rate: Rate) -> Decision {
        // Relaxed on the first load and on failure: the CAS itself orders the updates of this
        // one variable, and the state publishes nothing else.
        let mut tat = self.0.load(Ordering::Relaxed);
        loop {
            let new_tat = match rate.step(tat, now, n) {
                Ok(new_tat) => new_tat,
                Err(wait) => return Decision::NotYet(wait),
            };
            match self
                .0
                .compare_exchange_weak(tat, new_tat, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Decision::Granted,
                Err(current) => tat = current,
            }
        }
    }

    /// Takes `n` tokens now or in the future, unless they would be due after `max_wait`:
    /// returns the delay until they are due, or `None` (nothing taken).
    pub(crate) fn reserve(&self, now: u64, n: u32, rate: Rate, max_wait: u64) -> Option<u64> {
        let previous = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                rate.reserve(tat, now, n, max_wait)
                    .map(|(new_tat, _)| new_tat)
            })
            .ok()?;
        rate.reserve(previous, now, n, max_wait)
            .map(|(_, delay)| delay)
    }

    /// Gives `refund` nanoseconds of tokens back, never making the bucket fuller than full
    /// (a state before `now`).
    pub(crate) fn refund(&self, now: u64, refund: u64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                Some(tat.saturating_sub(refund).max(now.min(tat)))
            });
    }

    /// Moves `tat` so that the tokens owed stay the same when the interval changes.
    pub(crate) fn rescale(&self, now: u64, old_interval: u64, new_interval: u64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                let owed = u128::from(tat.saturating_sub(now));
                let scaled = owed * u128::from(new_interval) / u128::from(old_interval.max(1));
                Some(now.saturating_add(u64::try_from(scaled).unwrap_or(u64::MAX)))
            });
    }

    /// Moves `tat` so that the tokens available stay the same when the burst changes
    /// (x/time/rate's `SetBurst`): raising it frees nothing now; lowering it caps what is
    /// available at the new burst.
    pub(crate) fn reburst(&self, now: u64, interval: u64, old_burst: u32, new_burst: u32) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                let base = tat.max(now);
                Some(if new_burst >= old_burst {
                    let shift = interval.saturating_mul(u64::from(new_burst - old_burst));
                    base.saturating_add(shift)
                } else {
                    let shift = interval.saturating_mul(u64::from(old_burst - new_burst));
                    base.saturating_sub(shift).max(now)
                })
            });
    }

    pub(crate) fn load(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, taskweave_loom))]
mod loom_models;

#[cfg(test)]
mod tests;
