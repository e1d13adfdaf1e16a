//! Rate limiters: how many per second, where a semaphore says how many at
//! once.
//!
//! - [`RateLimiter`]: a token bucket (rate and burst) with [`wait`](RateLimiter::wait),
//!   [`allow`](RateLimiter::allow), [`reserve`](RateLimiter::reserve) (a delay, and a cancel
//!   that gives the tokens back), n-token variants (more than the burst is an error, not a
//!   hang), and live [`set_rate`](RateLimiter::set_rate) / [`set_burst`](RateLimiter::set_burst).
//! - [`TickLimiter`]: strict spacing, never a burst; closable.
//! - [`KeyedRateLimiter`]: a bucket per key, a bound on the number of keys, and built-in
//!   eviction of idle keys.
//! - [`RateLimitExt::rate_limited`]: any stream at the limiter's rate.
//!
//! Every limiter follows tokio's paused clock, so tests run on `start_paused` time. The token
//! buckets choose their clock at their first use: tokio's where it is paused, otherwise the
//! CPU's time-stamp counter, which is cheaper to read (see [`RateLimiter`]).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use taskweave_limit::RateLimiter;
//! use tokio::time::Instant;
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let outbound = RateLimiter::new(100, 10); // 100 emails a second, bursts of 10
//! let token = CancellationToken::new();
//! let started = Instant::now();
//! for _ in 0..30 {
//!     outbound.wait(&token).await.unwrap();
//! }
//! // 10 at once, then one every 10 ms.
//! assert_eq!(started.elapsed(), Duration::from_millis(200));
//! # }
//! ```

mod error;
mod gcra;
mod keyed;
mod rate;
mod stream;
mod tick;

pub use error::{CheckError, WaitError};
pub use keyed::KeyedRateLimiter;
pub use rate::{RateLimiter, Reservation};
pub use stream::{RateLimitExt, RateLimited};
pub use tick::TickLimiter;
