//! The algorithm's arithmetic at the extremes (pure functions of `now`).

use proptest::prelude::*;

use super::{MAX_WINDOW, Rate};
use std::time::Duration;

#[test]
fn an_interval_of_duration_max_allows_the_burst_then_nothing() {
    for burst in [1, 2, 5, u32::MAX] {
        let rate = Rate::new(Duration::MAX, burst);
        assert!(u128::from(rate.interval) * u128::from(rate.burst) <= u128::from(MAX_WINDOW));
        let now = 1_000;
        let tat = rate.step(0, now, burst).expect("the whole burst at once");
        let wait = rate.step(tat, now, 1).unwrap_err();
        assert!(wait >= rate.interval, "burst {burst}: wait {wait}");
    }
}

fn interval() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (1_u64..1_000).prop_map(Duration::from_nanos),
        (1_u64..u64::MAX).prop_map(Duration::from_nanos),
        Just(Duration::MAX),
        (1_u64..u64::MAX).prop_map(Duration::from_secs),
    ]
}

proptest! {
    /// Over any sequence of requests at increasing times, no more tokens are granted than
    /// the burst plus one per interval elapsed, whatever the interval and burst.
    #[test]
    fn grants_never_exceed_the_burst_plus_the_refill(
        interval in interval(),
        burst in prop_oneof![1_u32..8, Just(u32::MAX), 1_u32..u32::MAX],
        steps in proptest::collection::vec((0_u64..1 << 40, 1_u32..4), 1..40),
    ) {
        let rate = Rate::new(interval, burst);
        let (mut tat, mut now, mut granted) = (0_u64, 0_u64, 0_u128);
        for (advance, n) in steps {
            now += advance;
            if n > rate.burst {
                continue;
            }
            if let Ok(new_tat) = rate.step(tat, now, n) {
                tat = new_tat;
                granted += u128::from(n);
            }
            let allowed = u128::from(rate.burst) + u128::from(now) / u128::from(rate.interval);
            prop_assert!(granted <= allowed, "{granted} > {allowed}");
        }
    }

    /// A reservation is due when the tokens would be there, never sooner, and one beyond
    /// `max_wait` takes nothing.
    #[test]
    fn a_reservation_beyond_its_maximum_wait_takes_nothing(
        interval in interval(),
        burst in 1_u32..8,
        held in 0_u64..1 << 40,
        max_wait in 0_u64..1 << 40,
    ) {
        let rate = Rate::new(interval, burst);
        let tat = held;
        match rate.reserve(tat, 0, 1, max_wait) {
            Some((_, delay)) => {
                prop_assert!(delay <= max_wait);
                // Due exactly when a check would be granted, not a nanosecond before.
                prop_assert!(rate.step(tat, delay, 1).is_ok());
                if delay > 0 {
                    prop_assert!(rate.step(tat, delay - 1, 1).is_err());
                }
            }
            None => prop_assert!(rate.step(tat, max_wait, 1).is_err()),
        }
    }
}
