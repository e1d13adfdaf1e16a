//! Pipeline stages on tokio: each source and stage runs on its own task and owns the bounded
//! output channel it creates.
//!
//! - Sources ([`Pipeline::iter`], [`Pipeline::repeat`], [`Pipeline::unfold`],
//!   [`Pipeline::stream`]) and stages ([`PipelineExt::spawn_map`],
//!   [`spawn_filter`](PipelineExt::spawn_filter),
//!   [`spawn_filter_map`](PipelineExt::spawn_filter_map),
//!   [`spawn_try_map`](PipelineExt::spawn_try_map)) each spawn one task, through
//!   `taskweave-supervise`, and return its output as a [`Stage`]: a `Stream` and
//!   `FusedStream`.
//! - Every stage closes its output on every exit path: its input ends, the token is
//!   cancelled, its consumer drops the output, or its function panics. A panic is logged
//!   with the stage's name and reported downstream ([`StageEnd::Panicked`], then
//!   [`StageEnd::UpstreamPanicked`] for every stage after it), never silent.
//! - [`PipelineExt::first`] is Go's `take(n)`: it drops its input after n items, which
//!   stops the stages upstream when the input is a [`Stage`].
//! - Capacities are never zero ([`Pipeline::with_capacity`] panics on zero, where a
//!   zero-sized buffer would hang).
//! - **A step waits by awaiting, never by blocking its thread** (a blocking call, or
//!   `tokio::task::block_in_place`) on something another stage of the same pipeline does.
//!   A stage hands on its finished items when its step awaits or its turn ends (and, while
//!   its reader waits, each one as it finishes), and wakes a stage upstream that waits for
//!   room after a turn of more than 32 items when its step awaits or its turn ends: a step
//!   that blocks waiting for them waits for ever. An awaiting step loses nothing: everything
//!   owed is handed on before the stage's task waits.
//!
//! # Example
//!
//! The squares of 1..=5, filtered to odd numbers; the consumer cancels after a value greater
//! than 8, and has seen exactly 1 and 9.
//!
//! ```
//! use futures::StreamExt;
//! use taskweave_pipeline::{Pipeline, PipelineExt};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let token = CancellationToken::new();
//! let p = Pipeline::new(token.clone());
//! let mut odd_squares = p
//!     .iter(1..=5_u64)
//!     .spawn_map(&p.named("square"), |n| async move { n * n })
//!     .spawn_filter(&p.named("odd"), |n| n % 2 == 1);
//!
//! let mut seen = Vec::new();
//! while let Some(v) = odd_squares.next().await {
//!     seen.push(v);
//!     if v > 8 {
//!         token.cancel(); // every stage stops and closes its output
//!         break;
//!     }
//! }
//! assert_eq!(seen, [1, 9]);
//! # }
//! ```

mod ext;
mod first;
mod pipeline;
mod run;
mod stage;

pub use ext::PipelineExt;
pub use first::First;
pub use pipeline::{DEFAULT_CAPACITY, MAX_CAPACITY, Pipeline};
pub use stage::{Stage, StageEnd};
/// Re-exported from `taskweave-supervise`, so that naming them needs no dependency on it.
pub use taskweave_supervise::{PanicError, TaskName};
