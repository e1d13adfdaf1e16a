//! Schedule settings and the pure arithmetic that picks the next start.

use std::time::Duration;

use tokio::time::Instant;

/// When the first run happens.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_periodic::{FirstRun, Periodic};
/// use tokio::time::Instant;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let token = CancellationToken::new();
/// let started = Instant::now();
/// let stop = token.clone();
/// Periodic::new(Duration::from_secs(10))
///     .with_first_run(FirstRun::Immediately)
///     .run(token, |_| {
///         assert_eq!(started.elapsed(), Duration::ZERO); // no wait for the first run
///         stop.cancel();
///         async {}
///     })
///     .await;
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FirstRun {
    /// One period after `run` starts, like Go's `time.Ticker` (the default).
    #[default]
    AfterPeriod,
    /// As soon as `run` starts, like tokio's `interval`; the usual choice for a cache warmer
    /// or a cleaner that should not wait a whole period after a deploy. A configured
    /// [jitter](crate::Periodic::with_jitter) delays this first run too.
    Immediately,
}

/// What happens to ticks that passed while a run was still going (fixed-rate schedules).
///
/// Neither policy replays missed ticks in a burst, which is what tokio's `interval` does by
/// default (`MissedTickBehavior::Burst`) and what turns one slow run into a stampede.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_periodic::{FirstRun, MissedTicks, Periodic};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let token = CancellationToken::new();
/// let stop = token.clone();
/// let mut runs = 0;
/// let report = Periodic::new(Duration::from_millis(100))
///     .with_first_run(FirstRun::Immediately)
///     .with_missed_ticks(MissedTicks::Skip)
///     .run(token, |_| {
///         runs += 1;
///         let slow = runs == 1;
///         if runs == 2 {
///             stop.cancel();
///         }
///         // The first run takes 350 ms: the ticks at 100, 200 and 300 ms are skipped and
///         // the second run starts at 400 ms instead of three runs in a row.
///         tokio::time::sleep(Duration::from_millis(if slow { 350 } else { 1 }))
///     })
///     .await;
/// assert_eq!((report.runs, report.skipped_ticks), (2, 3));
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissedTicks {
    /// Drop the missed ticks and run at the next tick of the original grid, keeping the phase
    /// (the default; Go's ticker also drops them).
    #[default]
    Skip,
    /// Run once at once when late, then continue one period after that late start (the grid
    /// shifts; at most one late run, never a burst).
    Delay,
}

/// How the gap between runs is measured.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_periodic::{Periodic, Schedule};
/// use tokio::time::Instant;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let token = CancellationToken::new();
/// let stop = token.clone();
/// let origin = Instant::now();
/// let mut starts = Vec::new();
/// Periodic::new(Duration::from_millis(100))
///     .with_schedule(Schedule::FixedGap)
///     .run(token, |_| {
///         starts.push(origin.elapsed().as_millis());
///         if starts.len() == 3 {
///             stop.cancel();
///         }
///         tokio::time::sleep(Duration::from_millis(50)) // each run takes 50 ms
///     })
///     .await;
/// assert_eq!(starts, [100, 250, 400]); // 100 ms from the end of one run to the next
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Schedule {
    /// Runs start on a fixed grid `origin + k * period` (the default).
    #[default]
    FixedRate,
    /// The next run starts one period after the previous run ended, however long it took.
    FixedGap,
}

/// The next scheduled start, and how many ticks were skipped to get there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Next {
    pub(crate) at: Instant,
    pub(crate) skipped: u64,
}

/// Picks the next start after a run that was scheduled at `scheduled` and ended at `ended`.
pub(crate) fn next_start(
    schedule: Schedule,
    missed: MissedTicks,
    period: Duration,
    scheduled: Instant,
    ended: Instant,
) -> Next {
    if schedule == Schedule::FixedGap {
        return Next {
            at: add(ended, period),
            skipped: 0,
        };
    }
    let due = add(scheduled, period);
    if ended <= due {
        return Next {
            at: due,
            skipped: 0,
        };
    }
    // Late by more than one period. `ticks = ceil(late_by / period)` grid points have passed
    // or are due right now; the next one is `ticks` periods after `scheduled`, computed from
    // `ended` so that no multiplication can overflow.
    let late_by = ended.duration_since(scheduled).as_nanos();
    let period_nanos = period.as_nanos();
    let ticks = late_by.div_ceil(period_nanos);
    let into_period = late_by % period_nanos;
    match missed {
        MissedTicks::Skip => {
            let wait = if into_period == 0 {
                Duration::ZERO
            } else {
                nanos(period_nanos - into_period)
            };
            Next {
                at: add(ended, wait),
                skipped: u64::try_from(ticks - 1).unwrap_or(u64::MAX),
            }
        }
        // One of the grid points that passed runs late, at `ended`; the others are dropped.
        MissedTicks::Delay => {
            let passed = late_by / period_nanos;
            Next {
                at: ended,
                skipped: u64::try_from(passed.saturating_sub(1)).unwrap_or(u64::MAX),
            }
        }
    }
}

/// `at + by`, or a far-away instant when that is past what `Instant` can hold (a period
/// of years): never a panic in the runner's loop.
pub(crate) fn add(at: Instant, by: Duration) -> Instant {
    at.checked_add(by)
        .unwrap_or_else(|| at + Duration::from_secs(60 * 60 * 24 * 365 * 30))
}

fn nanos(value: u128) -> Duration {
    // `value` is below one period, which is a `Duration`.
    let secs = u64::try_from(value / 1_000_000_000).unwrap_or(u64::MAX);
    let subsec = u32::try_from(value % 1_000_000_000).unwrap_or(0);
    Duration::new(secs, subsec)
}

#[cfg(test)]
mod tests;
