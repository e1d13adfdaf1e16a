//! Tee on tokio: every value of one stream to n outputs.
//!
//! [`tee`], [`tee_n`] and [`tee_with`] spawn one task (through `taskweave-supervise`) that
//! reads the input and hands every value to every output (`T: Clone`). Each output has its
//! own [`Policy`] for a consumer that falls behind: lockstep (wait: the slowest consumer sets
//! the pace, Go's tee), drop-oldest with a lag count, or disconnect after a bound. A dropped
//! output never stalls the others. The task stops, closing every output, when the input ends,
//! the token is cancelled, or every output is gone. Works on every tokio runtime.
//!
//! # Example
//!
//! ```
//! use futures::StreamExt;
//! use taskweave_tee::tee;
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let (audit, billing) = tee(CancellationToken::new(), futures::stream::iter(["a", "b"]));
//! let (audit, billing) = tokio::join!(audit.collect::<Vec<_>>(), billing.collect::<Vec<_>>());
//! assert_eq!(audit, ["a", "b"]);
//! assert_eq!(billing, ["a", "b"]);
//! # }
//! ```

mod output;
mod policy;
mod tee;

pub use output::TeeOutput;
pub use policy::{DEFAULT_CAPACITY, MAX_CAPACITY, MAX_OUTPUTS, Policy};
/// Re-exported from `taskweave-supervise`, so that naming it needs no dependency on it.
pub use taskweave_supervise::PanicError;
pub use tee::{tee, tee_n, tee_with};
