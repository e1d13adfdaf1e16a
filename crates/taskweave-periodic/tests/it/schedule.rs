//! When runs start: first run, fixed rate, missed ticks, fixed gap, jitter (paused clock).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use taskweave_periodic::{FirstRun, MissedTicks, Periodic, PeriodicReport, Schedule};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);

/// Runs `periodic` for `total`, each run taking `work(run_index)`, and returns the report and
/// the start and end of every run in milliseconds since the start.
async fn record(
    periodic: Periodic,
    total: Duration,
    work: impl Fn(usize) -> Duration + Send + 'static,
) -> (PeriodicReport, Vec<(u64, u64)>) {
    let origin = Instant::now();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&runs);
    let token = CancellationToken::new();
    let stopper = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(total).await;
        stopper.cancel();
    });
    let millis = move |at: Instant| u64::try_from(at.duration_since(origin).as_millis()).unwrap();
    let report = periodic
        .run(token, move |_run_token| {
            let recorded = Arc::clone(&recorded);
            let index = recorded.lock().unwrap().len();
            let duration = work(index);
            async move {
                let start = Instant::now();
                recorded.lock().unwrap().push((millis(start), u64::MAX));
                tokio::time::sleep(duration).await;
                recorded.lock().unwrap()[index].1 = millis(Instant::now());
            }
        })
        .await;
    let runs = runs.lock().unwrap().clone();
    (report, runs)
}

fn starts(runs: &[(u64, u64)]) -> Vec<u64> {
    runs.iter().map(|(start, _)| *start).collect()
}

#[tokio::test(start_paused = true)]
async fn first_run_waits_one_period_by_default() {
    let (report, runs) = record(Periodic::new(100 * MS), 350 * MS, |_| MS).await;
    assert_eq!(starts(&runs), [100, 200, 300]);
    assert_eq!(report.runs, 3);
    assert_eq!(report.succeeded, 3);
}

#[tokio::test(start_paused = true)]
async fn first_run_can_be_immediate() {
    let periodic = Periodic::new(100 * MS).with_first_run(FirstRun::Immediately);
    let (_, runs) = record(periodic, 350 * MS, |_| MS).await;
    assert_eq!(starts(&runs), [0, 100, 200, 300]);
}

#[tokio::test(start_paused = true)]
async fn fixed_rate_keeps_the_grid_whatever_the_run_takes() {
    let periodic = Periodic::new(100 * MS).with_first_run(FirstRun::Immediately);
    let (_, runs) = record(periodic, 450 * MS, |index| MS * (10 + 20 * index as u32)).await;
    assert_eq!(starts(&runs), [0, 100, 200, 300, 400]);
}

// tokio's `interval` would fire 3 runs back to back after the long one; we never burst.
#[tokio::test(start_paused = true)]
async fn a_long_run_skips_the_missed_ticks_instead_of_bursting() {
    let periodic = Periodic::new(100 * MS).with_first_run(FirstRun::Immediately);
    let (report, runs) = record(periodic, 650 * MS, |index| {
        if index == 1 { 350 * MS } else { 10 * MS }
    })
    .await;
    // Run 1 spans 100..450: ticks 200, 300 and 400 are skipped; the grid resumes at 500.
    assert_eq!(runs[1], (100, 450));
    assert_eq!(starts(&runs), [0, 100, 500, 600]);
    assert_eq!(report.skipped_ticks, 3);
}

#[tokio::test(start_paused = true)]
async fn delay_runs_once_late_and_then_keeps_the_period() {
    let periodic = Periodic::new(100 * MS)
        .with_first_run(FirstRun::Immediately)
        .with_missed_ticks(MissedTicks::Delay);
    let (report, runs) = record(periodic, 700 * MS, |index| {
        if index == 1 { 350 * MS } else { 10 * MS }
    })
    .await;
    assert_eq!(starts(&runs), [0, 100, 450, 550, 650]);
    assert_eq!(report.skipped_ticks, 2);
}

#[tokio::test(start_paused = true)]
async fn runs_never_overlap() {
    let periodic = Periodic::new(10 * MS).with_first_run(FirstRun::Immediately);
    let (_, runs) = record(periodic, 500 * MS, |index| MS * ((index as u32 * 7) % 45)).await;
    for pair in runs.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "overlap: {pair:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn fixed_gap_measures_from_the_end_of_a_run() {
    let periodic = Periodic::new(100 * MS)
        .with_first_run(FirstRun::Immediately)
        .with_schedule(Schedule::FixedGap);
    let (report, runs) = record(periodic, 500 * MS, |_| 50 * MS).await;
    assert_eq!(starts(&runs), [0, 150, 300, 450]);
    assert_eq!(report.skipped_ticks, 0);
}

#[tokio::test(start_paused = true)]
async fn jitter_delays_each_start_within_its_bound_without_drifting() {
    let periodic = Periodic::new(100 * MS)
        .with_jitter(30 * MS)
        .with_jitter_seed(7);
    let (_, runs) = record(periodic.clone(), 1050 * MS, |_| MS).await;
    assert_eq!(runs.len(), 10);
    let offsets: Vec<u64> = starts(&runs)
        .into_iter()
        .enumerate()
        .map(|(index, start)| start - 100 * (index as u64 + 1))
        .collect();
    assert!(offsets.iter().all(|offset| *offset <= 30), "{offsets:?}");
    let distinct: std::collections::BTreeSet<_> = offsets.iter().collect();
    assert!(distinct.len() > 3, "the starts are spread: {offsets:?}");
    // The same seed gives the same schedule.
    let (_, again) = record(periodic, 1050 * MS, |_| MS).await;
    assert_eq!(starts(&runs), starts(&again));
}

#[test]
#[should_panic(expected = "jitter (100ms) must be smaller than the period (100ms)")]
fn jitter_as_large_as_the_period_is_a_programmer_error() {
    let _ = Periodic::new(100 * MS).with_jitter(100 * MS);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    // Fixed rate with skip: every run starts on the grid, after the previous one ended, and
    // every grid point up to the stop is either run or counted as skipped.
    #[test]
    fn fixed_rate_runs_start_on_the_grid_and_account_for_every_tick(
        durations in proptest::collection::vec(0_u64..350, 1..40),
    ) {
        let runtime = taskweave_testkit::paused_runtime();
        let work = durations.clone();
        let (report, runs) = runtime.block_on(record(
            Periodic::new(100 * MS).with_first_run(FirstRun::Immediately),
            Duration::from_millis(4_050),
            move |index| Duration::from_millis(work[index % work.len()]),
        ));
        for pair in runs.windows(2) {
            prop_assert!(pair[0].1 <= pair[1].0);
        }
        for (start, _) in &runs {
            prop_assert_eq!(start % 100, 0);
        }
        // Every grid point before the one the runner would have used next was either run or
        // skipped, exactly once.
        let (last_start, last_end) = *runs.last().unwrap();
        let next_grid_point = (last_start + 100).max(last_end.div_ceil(100) * 100);
        prop_assert_eq!(report.runs + report.skipped_ticks, next_grid_point / 100);
        prop_assert_eq!(report.runs, runs.len() as u64);
    }
}
