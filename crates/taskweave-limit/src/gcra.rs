//! The generic cell rate algorithm on an atomic "theoretical arrival time", on tokio's clock.
//!
//! A bucket of `burst` tokens refilled one per `interval` is the same as this: keep the time
//! `tat` at which the bucket would be full again; a request for `n` tokens at `now` is
//! granted when `max(tat, now) + n * interval <= now + burst * interval`, and then moves
//! `tat` there. A `tat` at or before `now` means a full bucket, so forgetting such a state
//! loses nothing (the keyed limiter relies on that to evict).

use std::sync::OnceLock;
use std::time::Duration;

#[cfg(all(test, taskweave_loom))]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(all(test, taskweave_loom)))]
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

/// Nanoseconds since the limiter's base instant: on tokio's clock (so the paused test clock
/// drives it), or on the CPU's time-stamp counter through `quanta`, which is several times
/// cheaper to read but does not follow tokio's paused time. [`Clock::auto`] picks the second
/// unless tokio's clock is paused.
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
    /// The time-stamp counter, unless tokio's clock is paused where this is called: then
    /// tokio's clock, so that `start_paused` tests drive the limiter.
    pub(crate) fn auto() -> Self {
        if tokio_clock_is_paused() {
            Clock::tokio()
        } else {
            Clock::fast()
        }
    }

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

/// A limiter's clock: chosen at the first use ([`Clock::auto`]) unless chosen before.
#[derive(Debug, Default)]
pub(crate) struct ClockChoice(OnceLock<Clock>);

impl ClockChoice {
    pub(crate) fn get(&self) -> &Clock {
        self.0.get_or_init(Clock::auto)
    }

    /// Fixes the clock; `method` names the public method for the panic message.
    #[track_caller]
    pub(crate) fn choose(&self, clock: Clock, method: &str) {
        assert!(
            self.0.set(clock).is_ok(),
            "{method}: choose the clock before the first use"
        );
    }
}

/// `true` when tokio's clock is paused here (`start_paused`, or `tokio::time::pause`).
///
/// Unpaused, `tokio::time::Instant::now()` is the system's monotonic clock, so two readings
/// with real time passing between them differ; paused, it only moves when the runtime
/// advances it, which cannot happen inside this synchronous call. The wait is for the system
/// clock to tick once (nanoseconds); outside a runtime tokio reads the system clock too.
fn tokio_clock_is_paused() -> bool {
    let before = Instant::now();
    let real = std::time::Instant::now();
    // Bounded: a system clock that does not tick at all (a simulator) reads as paused,
    // which picks tokio's clock, the one that is right in every case.
    for _ in 0..1_000_000 {
        if std::time::Instant::now() > real {
            return Instant::now() == before;
        }
        std::hint::spin_loop();
    }
    true
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
    pub(crate) fn check(&self, now: u64, n: u32, interval: u64, burst: u32) -> Decision {
        let cost = interval.saturating_mul(u64::from(n));
        let horizon = now.saturating_add(interval.saturating_mul(u64::from(burst)));
        // Relaxed on the first load and on failure: the CAS itself orders the updates of this
        // one variable, and the state publishes nothing else.
        let mut tat = self.0.load(Ordering::Relaxed);
        loop {
            let new_tat = tat.max(now).saturating_add(cost);
            if new_tat > horizon {
                return Decision::NotYet(new_tat - horizon);
            }
            match self
                .0
                .compare_exchange_weak(tat, new_tat, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Decision::Granted,
                Err(current) => tat = current,
            }
        }
    }

    /// Takes `n` tokens now or in the future, whatever the state: returns how long until they
    /// are due, and the `tat` this reservation moved to.
    pub(crate) fn reserve(&self, now: u64, n: u32, interval: u64, burst: u32) -> (u64, u64) {
        let cost = interval.saturating_mul(u64::from(n));
        let horizon = now.saturating_add(interval.saturating_mul(u64::from(burst)));
        let previous = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                Some(tat.max(now).saturating_add(cost))
            })
            .unwrap_or_else(|tat| tat);
        let new_tat = previous.max(now).saturating_add(cost);
        (new_tat.saturating_sub(horizon), new_tat)
    }

    /// Cancels a reservation of `n` tokens that moved `tat` to `reserved_tat` and was due at
    /// `due` (Go's `x/time/rate` rule): nothing if it is already due; otherwise the tokens
    /// not yet re-reserved by later callers (those reserved after it keep their place), and
    /// never to a time before `now`.
    pub(crate) fn cancel(&self, now: u64, n: u32, interval: u64, reserved_tat: u64, due: u64) {
        if due <= now {
            return;
        }
        let cost = interval.saturating_mul(u64::from(n));
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                let reserved_after = tat.saturating_sub(reserved_tat);
                let refund = cost.saturating_sub(reserved_after);
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

    pub(crate) fn load(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Loom models of the compare-and-swap steps: every interleaving of the threads, on loom's
/// atomics. Run with `RUSTFLAGS="--cfg taskweave_loom" cargo test -p taskweave-limit --lib`.
#[cfg(all(test, taskweave_loom))]
mod loom_models {
    use loom::sync::Arc;

    use super::{Decision, Tat};

    const INTERVAL: u64 = 10;

    #[test]
    fn concurrent_checks_grant_exactly_the_burst() {
        loom::model(|| {
            let tat = Arc::new(Tat::default());
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let tat = Arc::clone(&tat);
                    loom::thread::spawn(move || {
                        matches!(tat.check(0, 1, INTERVAL, 2), Decision::Granted)
                    })
                })
                .collect();
            let here = matches!(tat.check(0, 1, INTERVAL, 2), Decision::Granted);
            let granted = threads
                .into_iter()
                .map(|thread| thread.join().unwrap())
                .filter(|granted| *granted)
                .count()
                + usize::from(here);
            assert_eq!(granted, 2);
            assert_eq!(tat.load(), 2 * INTERVAL);
        });
    }

    #[test]
    fn a_cancelled_reservation_never_moves_a_later_one() {
        loom::model(|| {
            // An empty bucket that owes 5 tokens: every reservation lies in the future.
            let tat = Arc::new(Tat(super::AtomicU64::new(5 * INTERVAL)));
            let other = {
                let tat = Arc::clone(&tat);
                loom::thread::spawn(move || tat.reserve(0, 1, INTERVAL, 1).1)
            };
            let (wait, reserved) = tat.reserve(0, 1, INTERVAL, 1);
            tat.cancel(0, 1, INTERVAL, reserved, wait);
            let other_reserved = other.join().unwrap();
            // Whatever the order, the state ends where the other reservation put it: the
            // cancelled tokens come back unless the other one was taken after them, and then
            // the other one keeps its place.
            assert_eq!(tat.load(), other_reserved);
        });
    }

    #[test]
    fn a_rate_change_during_checks_loses_no_grant() {
        loom::model(|| {
            let tat = Arc::new(Tat::default());
            let checker = {
                let tat = Arc::clone(&tat);
                loom::thread::spawn(move || {
                    matches!(tat.check(0, 1, INTERVAL, 1), Decision::Granted)
                })
            };
            // Doubling the interval at `now` = 0 doubles what is owed, never drops it.
            tat.rescale(0, INTERVAL, 2 * INTERVAL);
            let granted = checker.join().unwrap();
            assert!(granted, "a single check on a full bucket is granted");
            let owed = tat.load();
            assert!(owed == INTERVAL || owed == 2 * INTERVAL, "owed {owed}");
        });
    }
}
