//! `PeriodicReport`: what a periodic runner did, returned when it stops.

use std::fmt;

/// Counts of what a [`Periodic`](crate::Periodic) runner did, returned when its token is
/// cancelled.
///
/// `runs == succeeded + failed + timed_out + panicked` always holds.
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
    /// Runs that panicked.
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
