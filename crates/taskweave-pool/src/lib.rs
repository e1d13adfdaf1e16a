//! Worker pools on tokio: process jobs on at most N concurrent workers, collect every result
//! and error, apply the backpressure you choose, and stop without losing anything.
//!
//! - [`run`]: a batch runner for a finite set of jobs; returns a [`BatchReport`] with every
//!   result tagged with its index, and the jobs that never started if the token was cancelled.
//! - [`WorkerPool`]: a long-lived pool with a bounded queue and an [`Overflow`] policy (block,
//!   reject, drop-oldest), panic isolation, an idempotent draining [`close`](WorkerPool::close),
//!   a [`close_within`](WorkerPool::close_within) deadline that hands back unstarted jobs, an
//!   optional [`Results`] stream, and [`PoolMetrics`]. Batches go in under one lock with
//!   [`submit_many`](WorkerPool::submit_many) / [`try_submit_many`](WorkerPool::try_submit_many),
//!   [`take_per_worker`](WorkerPoolBuilder::take_per_worker) lets workers take several
//!   queued jobs at once, and [`resume_at`](WorkerPoolBuilder::resume_at) makes a full queue
//!   wait until it has drained that far before it takes jobs again (fewer wake-ups of a
//!   submitter outside the runtime).
//!
//! Two things to know first:
//!
//! - The [`Results`] stream ends only once nobody can submit any more (the pool closed, or
//!   every handle dropped). Drain it while [`close`](WorkerPool::close) runs, or take it with
//!   [`into_results`](WorkerPool::into_results), which gives up the reader's handle; a reader
//!   holding a handle it never closes waits for ever.
//! - `submit` takes a token of its own besides the pool's: the pool's token (or
//!   [`WorkerPool::token`]) costs nothing extra, and a request's own token lets that request
//!   give up waiting for queue space (see "Cost of the token" on
//!   [`submit`](WorkerPool::submit)).
//!
//! # Example
//!
//! ```
//! use taskweave_pool::{SubmitError, WorkerPool};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let token = CancellationToken::new();
//! let pool = WorkerPool::new(token.clone(), 4, 64, |_context, order_id: u64| async move {
//!     // charge the card, write the row …
//!     Ok::<_, String>(order_id)
//! });
//! for order_id in 0..10 {
//!     pool.submit(&token, order_id).await.unwrap();
//! }
//! let report = pool.close().await;
//! assert_eq!(report.metrics.completed, 10);
//! assert!(report.handed_back.is_empty());
//! assert!(matches!(pool.submit(&token, 11).await, Err(SubmitError::Closed(11))));
//! # }
//! ```

mod batch;
mod context;
mod error;
mod pool;
mod queue;

pub use batch::{BatchReport, run};
pub use context::JobContext;
pub use error::{JobError, JobResult, Refusal, SubmitError, SubmitManyError, TrySubmitError};
pub use pool::{
    CloseReport, MAX_WORKERS, Overflow, PoolMetrics, Results, WorkerPool, WorkerPoolBuilder,
};
/// Re-exported from `taskweave-supervise`, so that naming them needs no dependency on it.
pub use taskweave_supervise::{PanicError, TaskName};
