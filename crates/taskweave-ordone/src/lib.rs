//! `or_done`: a stream that ends as soon as a token is cancelled or its input ends.
//!
//! Go's or-done channel wraps a channel so that a consumer ranging over it stops when the
//! context is done. [`or_done`] (and [`OrDoneExt::or_done`]) does the same for any `Stream`:
//! the consumer's loop needs no `select!`. It is an adapter, not a task: it runs when it is
//! polled, owns nothing but the input, and dropping it drops the input.
//!
//! # Example
//!
//! ```
//! use futures::StreamExt;
//! use taskweave_ordone::OrDoneExt;
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let token = CancellationToken::new();
//! let mut events = futures::stream::iter(1..).or_done(token.clone());
//! let mut seen = Vec::new();
//! while let Some(event) = events.next().await {
//!     seen.push(event);
//!     if event == 3 {
//!         token.cancel(); // the loop ends on the next poll, without a select!
//!     }
//! }
//! assert_eq!(seen, [1, 2, 3]);
//! # }
//! ```

mod or_done;

pub use or_done::{OrDone, OrDoneExt, or_done};
