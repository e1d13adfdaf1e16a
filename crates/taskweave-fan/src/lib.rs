//! Fan-in and fan-out on tokio.
//!
//! - [`merge`]: any number of streams into one, fairly (round-robin: no input is starved),
//!   until all of them end or the token is cancelled. An adapter: no task.
//! - [`fan_out`]: n copies of a stage taking turns reading one shared input,
//!   each item processed exactly once, the outputs merged; order is not kept.
//!
//! # Example
//!
//! ```
//! use futures::StreamExt;
//! use taskweave_fan::{fan_out, merge};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let token = CancellationToken::new();
//! let a = futures::stream::iter(vec![1, 3, 5]);
//! let b = futures::stream::iter(vec![2, 4, 6]);
//! let merged = merge(token.clone(), [a, b]);
//! let mut doubled: Vec<i32> = fan_out(token, merged, 2, |n| async move { n * 2 }).collect().await;
//! doubled.sort_unstable();
//! assert_eq!(doubled, [2, 4, 6, 8, 10, 12]);
//! # }
//! ```

mod fan_out;
mod merge;

pub use fan_out::{FanOut, MAX_WORKERS, fan_out};
pub use merge::{Merge, merge};
