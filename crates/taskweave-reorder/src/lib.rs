//! Reordering on tokio: put indexed items back in order within a bounded window.
//!
//! - [`ReorderBuffer`]: push `(index, value)` in any order, pop values in index order; an
//!   index beyond the window is refused and handed back (so a producer holds it instead of
//!   the buffer growing without bound), a duplicate is an error, and gaps left at the end
//!   are reported.
//! - [`reorder_channel`]: the buffer between tasks. Producers `send(index, value).await`
//!   and are held back while the index is beyond the window (backpressure); the receiver is
//!   a stream of the values in index order, with the gaps reported when the producers are gone.
//! - [`reorder`]: the same as a stream adapter over `(index, value)` items. One stream
//!   cannot be held back usefully (a missing index could only arrive later on that same
//!   stream, so waiting would hang): an index beyond the window is yielded as an error with
//!   its value instead. Producers that can wait get the window's backpressure from
//!   [`ReorderBuffer::push`] (the item is handed back) or from [`map_ordered`].
//! - [`map_ordered`]: a parallel map whose calls run on spawned tasks, `concurrency` at a
//!   time, with results yielded in input order; a panic becomes an error at its item's place.
//! - [`ReorderExt`]: `reorder` and `map_ordered` as methods on any stream.
//!
//! # Example
//!
//! ```
//! use futures::StreamExt;
//! use taskweave_reorder::map_ordered;
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let words = futures::stream::iter(["parse", "map", "reorder"]);
//! let lengths: Vec<usize> = map_ordered(CancellationToken::new(), words, 2, |w| async move { w.len() })
//!     .map(|len| len.expect("no panic"))
//!     .collect()
//!     .await;
//! assert_eq!(lengths, [5, 3, 7]);
//! # }
//! ```

mod adapter;
mod buffer;
mod channel;
mod error;
mod ext;
mod map_ordered;

pub use adapter::{Reorder, reorder};
pub use buffer::ReorderBuffer;
pub use channel::{ReorderReceiver, ReorderSender, SendError, reorder_channel};
pub use error::{MissingIndices, PushError, ReorderError};
pub use ext::ReorderExt;
pub use map_ordered::{MAX_CONCURRENCY, MapOrdered, map_ordered};
/// Re-exported from `taskweave-supervise`, so that naming it needs no dependency on it.
pub use taskweave_supervise::PanicError;
