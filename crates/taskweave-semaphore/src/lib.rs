//! A fair, cancellable counting and weighted semaphore on tokio.
//!
//! [`Semaphore`] limits how many operations run at once when the tasks are not yours (HTTP
//! handlers calling an external API at most 10 at a time). Acquiring takes the caller's
//! [`CancellationToken`](tokio_util::sync::CancellationToken) and tells
//! [`Cancelled`](AcquireError::Cancelled) from [`Closed`](AcquireError::Closed); a request
//! above the capacity fails at once ([`TooLarge`](AcquireError::TooLarge)); permits are RAII;
//! waiters are served first come, first served; the capacity can be resized live.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use taskweave_semaphore::{AcquireError, Semaphore};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let db = Semaphore::new(2);
//! let token = CancellationToken::new();
//! let _a = db.acquire(&token).await.unwrap();
//! let _b = db.acquire(&token).await.unwrap();
//! assert_eq!(db.in_use(), 2);
//!
//! // A third request waits; the request's deadline cancels it.
//! let deadline = token.child_token();
//! let canceller = deadline.clone();
//! tokio::spawn(async move {
//!     tokio::time::sleep(Duration::from_millis(100)).await;
//!     canceller.cancel();
//! });
//! assert_eq!(db.acquire(&deadline).await.unwrap_err(), AcquireError::Cancelled);
//! # }
//! ```

mod acquire;
mod error;
mod permit;
mod semaphore;
mod state;

pub use acquire::{Acquire, AcquireOwned, PollSemaphore};
pub use error::{AcquireError, TryAcquireError};
pub use permit::{OwnedPermit, Permit};
pub use semaphore::Semaphore;
pub use state::MAX_PERMITS;
