//! Rate limiters: how many per second, where a semaphore says how many at
//! once.
//!
//! - [`RateLimiter`]: a token bucket of a [`Quota`] (`Quota::per_second(50).with_burst(5)`,
//!   `Quota::every(Duration::from_secs(2))`) with [`wait`](RateLimiter::wait) (a named
//!   [`Wait`] future), [`allow`](RateLimiter::allow), [`reserve`](RateLimiter::reserve) (a
//!   delay, and a cancel that gives the tokens back), n-token variants (more than the burst
//!   is an error, not a hang), waits and reservations with a deadline, and live
//!   [`set_quota`](RateLimiter::set_quota) / [`set_interval`](RateLimiter::set_interval) /
//!   [`set_burst`](RateLimiter::set_burst), with x/time/rate's semantics.
//! - [`TickLimiter`]: strict spacing, never a burst; closable.
//! - [`KeyedRateLimiter`]: a bucket per key, a bound on the number of keys, and built-in
//!   eviction of idle keys; the same calls per key (`allow_n`, `wait_n`, `reserve_n`).
//! - [`RateLimitExt::rate_limited`]: any stream at the limiter's rate.
//!
//! A cancellation observed before the tokens are handed over wins: a wait whose token is
//! already cancelled takes nothing, on every limiter here.
//!
//! The clock, in one sentence: a token bucket reads the CPU's time-stamp counter (as
//! governor does) unless it was built with `with_tokio_clock()` (the keyed builder's
//! `tokio_clock()`), whatever the runtime and whenever it is first used; build it that way to
//! drive it with tokio's paused clock in tests. [`TickLimiter`] always follows tokio's clock.
//! With the `governor` feature, `Quota::from(governor::Quota)` brings a governor quota over.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use taskweave_limit::{Quota, RateLimiter};
//! use tokio::time::Instant;
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // 100 emails a second, bursts of 10 (on tokio's clock, which this example pauses).
//! let outbound = RateLimiter::new(Quota::per_second(100).with_burst(10)).with_tokio_clock();
//! let token = CancellationToken::new();
//! let started = Instant::now();
//! for _ in 0..30 {
//!     outbound.wait(&token).await.unwrap();
//! }
//! // 10 at once, then one every 10 ms.
//! assert_eq!(started.elapsed(), Duration::from_millis(200));
//! # }
//! ```

// docs.rs builds with `--cfg docsrs` on nightly: mark each feature-gated item.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod gcra;
mod keyed;
mod quota;
mod rate;
mod stream;
mod tick;
mod wait;

pub use error::{CheckError, WaitError};
pub use keyed::{DEFAULT_MAX_KEYS, KeyedRateLimiter, KeyedRateLimiterBuilder, KeyedReservation};
pub use quota::Quota;
pub use rate::{RateLimiter, Reservation};
pub use stream::{RateLimitExt, RateLimited};
pub use tick::{TickLimiter, TickWait};
pub use wait::{KeyedWait, Wait};
