//! errgroup-style task groups on tokio.
//!
//! - [`TaskGroup`]: the first failure (by time) cancels the others and is what
//!   [`wait`](TaskGroup::wait) returns ([`wait_all`](TaskGroup::wait_all) returns them all,
//!   the first first); an optional limit with waiting [`spawn`](TaskGroup::spawn) and
//!   non-waiting [`try_spawn`](TaskGroup::try_spawn); tasks spawn siblings through a
//!   [`Spawner`]; finished tasks are reaped at every spawn and every `len()`, so a
//!   long-lived group holds only its running tasks; panics become failures with a
//!   backtrace, never a panic in `wait`.
//! - [`CollectGroup`]: independent tasks, every failure reported with its label.
//! - [`map_parallel`] and [`map_parallel_all`]: ordered parallel map, first-failure-cancels or
//!   collect-all.
//!
//! # Example
//!
//! Assembling a page from three sources, where any failure makes the page pointless:
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use taskweave_group::TaskGroup;
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let page = Arc::new(Mutex::new(Vec::new()));
//! let group = TaskGroup::new(CancellationToken::new()).with_limit(2);
//! for source in ["header", "body", "footer"] {
//!     let page = Arc::clone(&page);
//!     let token = group.token();
//!     group
//!         .spawn(async move {
//!             if token.is_cancelled() {
//!                 return Err(format!("{source}: cancelled"));
//!             }
//!             page.lock().unwrap().push(source);
//!             Ok(())
//!         })
//!         .await
//!         .unwrap();
//! }
//! group.wait().await.unwrap();
//! assert_eq!(page.lock().unwrap().len(), 3);
//! # }
//! ```

mod collect;
mod error;
mod group;
mod map;
mod slots;
mod spawner;

pub use collect::{CollectGroup, CollectReport};
pub use error::TaskFailure;
pub use group::TaskGroup;
pub use map::{map_parallel, map_parallel_all};
pub use spawner::Spawner;
/// Re-exported from `taskweave-supervise`, so that naming them needs no dependency on it.
pub use taskweave_supervise::{PanicError, SpawnError};
