//! Spawn tokio tasks whose panics are never lost, and supervise long-lived tasks.
//!
//! tokio keeps a task's panic inside its `JoinHandle`: a detached task that panics disappears
//! without a trace, and an awaited one yields a `JoinError` without a backtrace. This crate is
//! the one place in taskweave that spawns, and every other crate spawns through it.
//!
//! - [`spawn`]: a named task; a panic is logged through `tracing` (name, message, location,
//!   backtrace) and returned to the awaiter as [`TaskError::Panicked`].
//! - [`catch_panic`]: the same capture for a future run inline.
//! - [`Supervisor`]: named tasks sharing a token; spawns are refused after
//!   [`close`](Supervisor::close) (the future is handed back); [`shutdown`](Supervisor::shutdown)
//!   drains by a deadline, aborts stragglers and returns a [`DrainReport`] naming them.
//! - [`Supervisor::spawn_restarting`] with a [`RestartPolicy`]: restart with exponential
//!   backoff up to an intensity limit, then escalate by cancelling the supervisor's token.
//! - [`TokenWatch`]: a `CancellationToken` checked with one atomic load, for the hot loops of
//!   the other crates.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use taskweave_supervise::Supervisor;
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let supervisor = Supervisor::new(CancellationToken::new());
//!
//! // A poller that runs until the supervisor's token is cancelled.
//! let token = supervisor.token();
//! supervisor
//!     .spawn("poller", async move {
//!         let mut ticks = 0;
//!         loop {
//!             tokio::select! {
//!                 () = token.cancelled() => break ticks,
//!                 () = tokio::time::sleep(Duration::from_millis(100)) => ticks += 1,
//!             }
//!         }
//!     })
//!     .unwrap();
//!
//! // A panicking task is caught; the poller and the process keep running.
//! let broken = supervisor.spawn("broken", async { panic!("worker exploded") }).unwrap();
//! assert_eq!(broken.await.unwrap_err().into_panic().unwrap().message(), "worker exploded");
//!
//! tokio::time::sleep(Duration::from_millis(250)).await;
//! let report = supervisor.shutdown(Duration::from_secs(1)).await;
//! assert!(report.is_clean());
//! assert_eq!(report.finished, ["poller"]);
//! assert_eq!(supervisor.metrics().panicked, 1);
//! # }
//! ```

mod catch;
mod error;
#[doc(hidden)]
pub mod internal;
mod name;
mod report;
mod restart;
mod spawn;
mod supervisor;
mod watch;

pub use catch::{CatchPanic, catch_panic, log_panics_to_tracing};
pub use error::{PanicError, SpawnError, TaskError};
pub use name::TaskName;
pub use report::{DrainReport, Escalation, SupervisorMetrics};
pub use restart::{Failure, RestartError, RestartPolicy};
pub use spawn::{TaskHandle, spawn};
pub use supervisor::Supervisor;
pub use watch::{RunUntilCancelled, TokenWatch};
