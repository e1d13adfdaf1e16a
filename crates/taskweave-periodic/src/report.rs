//! `PeriodicReport`: what a periodic runner did, returned when it stops.

use std::fmt;

/// Counts of what a [`Periodic`](crate::Periodic) runner did, returned when its token is
/// cancelled.
///
/// `runs == succeeded + failed + timed_out + panicked` always holds.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_periodic::Periodic;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let token = CancellationToken::new();
/// let stop = token.clone();
/// let mut run = 0;
/// let report = Periodic::new(Duration::from_secs(1))
///     .run(token, |_| {
///         run += 1;
///         if run == 2 {
///             stop.cancel();
///         }
///         async move { if run == 1 { Err("timeout talking to S3") } else { Ok(()) } }
///     })
///     .await;
/// assert_eq!(
///     report.to_string(),
///     "2 runs: 1 succeeded, 1 failed, 0 timed out, 0 panicked; 0 ticks skipped"
/// );
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeriodicReport {
    /// Runs started.
    pub runs: u64,
    /// Runs that returned `()` or `Ok`.
    pub succeeded: u64,
    /// Runs that returned `Err`.
    pub failed: u64,
    /// Runs cut short by the per-run timeout.
    pub timed_out: u64,
    /// Runs that panicked: in the job, or in the user code that ends a run (dropping its
    /// future when the timeout fires, formatting its error, dropping its outcome). Each run
    /// is counted once, so a timed-out run whose future panics when dropped counts here.
    pub panicked: u64,
    /// Ticks dropped because a run was still going when they came (fixed-rate only).
    pub skipped_ticks: u64,
}

impl fmt::Display for PeriodicReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} runs: {} succeeded, {} failed, {} timed out, {} panicked; {} ticks skipped",
            self.runs,
            self.succeeded,
            self.failed,
            self.timed_out,
            self.panicked,
            self.skipped_ticks
        )
    }
}
