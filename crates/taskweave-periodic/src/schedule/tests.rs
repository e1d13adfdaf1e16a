use std::time::Duration;

use tokio::time::Instant;

use super::{MissedTicks, Next, Schedule, next_start};

const PERIOD: Duration = Duration::from_millis(10);

fn ms(origin: Instant, millis: u64) -> Instant {
    origin + Duration::from_millis(millis)
}

fn next(schedule: Schedule, missed: MissedTicks, ended_ms: u64) -> (u64, u64) {
    let origin = Instant::now();
    let Next { at, skipped } = next_start(schedule, missed, PERIOD, origin, ms(origin, ended_ms));
    let at_ms = u64::try_from(at.duration_since(origin).as_millis()).unwrap();
    (at_ms, skipped)
}

#[test]
fn on_time_run_keeps_the_grid() {
    for missed in [MissedTicks::Skip, MissedTicks::Delay] {
        assert_eq!(next(Schedule::FixedRate, missed, 3), (10, 0));
        assert_eq!(next(Schedule::FixedRate, missed, 10), (10, 0));
    }
}

#[test]
fn skip_jumps_to_the_next_grid_point_and_counts_the_missed_ones() {
    assert_eq!(next(Schedule::FixedRate, MissedTicks::Skip, 12), (20, 1));
    assert_eq!(next(Schedule::FixedRate, MissedTicks::Skip, 20), (20, 1));
    assert_eq!(next(Schedule::FixedRate, MissedTicks::Skip, 25), (30, 2));
    assert_eq!(next(Schedule::FixedRate, MissedTicks::Skip, 100), (100, 9));
}

#[test]
fn delay_runs_once_late_and_drops_the_rest() {
    assert_eq!(next(Schedule::FixedRate, MissedTicks::Delay, 12), (12, 0));
    assert_eq!(next(Schedule::FixedRate, MissedTicks::Delay, 25), (25, 1));
    assert_eq!(next(Schedule::FixedRate, MissedTicks::Delay, 100), (100, 9));
}

#[test]
fn a_huge_overrun_of_a_tiny_period_lands_on_the_next_grid_point() {
    // 2^33 + 0.5 periods late: more ticks than fit in a `u32`.
    let origin = Instant::now();
    let period = Duration::from_nanos(1_000);
    let ended = origin + Duration::from_nanos((1_u64 << 33) * 1_000 + 500);
    let Next { at, skipped } = next_start(
        Schedule::FixedRate,
        MissedTicks::Skip,
        period,
        origin,
        ended,
    );
    assert_eq!(at.duration_since(ended), Duration::from_nanos(500));
    assert_eq!(skipped, 1_u64 << 33);
}

#[test]
fn fixed_gap_measures_from_the_end_of_the_run() {
    assert_eq!(next(Schedule::FixedGap, MissedTicks::Skip, 3), (13, 0));
    assert_eq!(next(Schedule::FixedGap, MissedTicks::Delay, 25), (35, 0));
}
