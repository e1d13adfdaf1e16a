//! Whole-application graceful shutdown on tokio.
//!
//! A [`Shutdown`] turns the first SIGINT or SIGTERM (or a call to [`Shutdown::trigger`])
//! into one ordered sequence: readiness flips to not-ready and the service keeps serving for a
//! delay; then the phases run in their declared order, sharing one total budget (time a phase
//! does not use rolls forward); critical sections are waited for until the hard deadline;
//! resources close in reverse order of opening, last of all. A phase that overruns is cut
//! off and reported, a panicking one is caught and reported, and the next one still runs.
//! The result is a [`ShutdownReport`]: a value, a table (`Display`), `tracing` events, and
//! JSON with the `json` feature. A second signal exits at once (130 for SIGINT, 143 for
//! SIGTERM) after printing the report so far, and [`block_on`] shuts the runtime down with a
//! timeout so that a stray blocking task cannot hang the process.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use taskweave_shutdown::{Shutdown, StepStatus};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let shutdown = Shutdown::new(CancellationToken::new(), Duration::from_secs(9));
//! // shutdown.listen_for_signals()?; // in a real service
//! shutdown.phase("http drain", |_ctx| async {
//!     tokio::time::sleep(Duration::from_secs(1)).await; // in-flight requests finish
//! });
//! shutdown.phase("consumer", |_ctx| async move {
//!     std::future::pending::<()>().await; // a consumer that never stops
//! });
//! shutdown.phase("telemetry flush", |_ctx| async {});
//!
//! shutdown.trigger("fatal error in the consumer");
//! let report = shutdown.run().await;
//! let consumer = report.step("consumer").unwrap();
//! assert!(matches!(consumer.status, StepStatus::TimedOut));
//! // 9 s over 3 phases: 3 s for the drain, which used 1; the consumer got half of the 8 left.
//! assert_eq!(consumer.granted, Duration::from_secs(4));
//! assert!(report.step("telemetry flush").unwrap().status.is_completed());
//! # }
//! ```

// docs.rs builds with `--cfg docsrs` on nightly: mark each feature-gated item.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod budget;
mod readiness;
mod report;
mod runtime;
mod shutdown;

pub use readiness::Readiness;
pub use report::{ShutdownReport, StepKind, StepReport, StepStatus, Trigger};
pub use runtime::block_on;
pub use shutdown::{CriticalSection, PhaseContext, Shutdown};
/// Re-exported from `taskweave-supervise`, so that naming it needs no dependency on it.
pub use taskweave_supervise::PanicError;
