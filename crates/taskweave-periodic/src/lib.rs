//! Run a job every period on tokio, without the pitfalls of a hand-written `interval` loop.
//!
//! [`Periodic`] never replays missed ticks in a burst, never overlaps runs, bounds each run by
//! a timeout, survives failing and panicking runs, lets the caller choose an immediate or a
//! delayed first run, offers fixed-rate and fixed-gap scheduling with optional jitter, stops on
//! a [`CancellationToken`](tokio_util::sync::CancellationToken) and returns a
//! [`PeriodicReport`].
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use taskweave_periodic::{Periodic, Schedule};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let token = CancellationToken::new();
//! let stopper = token.clone();
//! let mut polls = 0;
//! let report = Periodic::new(Duration::from_millis(100))
//!     .with_schedule(Schedule::FixedGap)
//!     .with_timeout(Duration::from_millis(50))
//!     .run(token, |_run_token| {
//!         polls += 1;
//!         let fail = polls == 2;
//!         if polls == 3 {
//!             stopper.cancel();
//!         }
//!         async move { if fail { Err("upstream unavailable") } else { Ok(()) } }
//!     })
//!     .await;
//! assert_eq!((report.runs, report.succeeded, report.failed), (3, 2, 1));
//! # }
//! ```

mod outcome;
mod periodic;
mod report;
mod schedule;

pub use outcome::RunOutcome;
pub use periodic::Periodic;
pub use report::PeriodicReport;
pub use schedule::{FirstRun, MissedTicks, Schedule};
/// Re-exported from `taskweave-supervise`, so that naming it needs no dependency on it.
pub use taskweave_supervise::TaskName;
