//! Errors: why a rate limiter granted nothing.

use std::error::Error;
use std::fmt;
use std::time::Duration;

/// Why [`RateLimiter::check_n`](crate::RateLimiter::check_n) granted nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckError {
    /// Not yet: the tokens are there after `wait`.
    NotYet {
        /// How long until the request would be granted (if nobody else takes tokens first).
        wait: Duration,
    },
    /// More tokens than the burst: never possible, so not worth waiting for.
    ExceedsBurst {
        /// Tokens requested.
        requested: u32,
        /// The limiter's burst.
        burst: u32,
    },
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::NotYet { wait } => write!(f, "rate limited for {wait:?}"),
            CheckError::ExceedsBurst { requested, burst } => {
                write!(f, "requested {requested} tokens of a burst of {burst}")
            }
        }
    }
}

impl Error for CheckError {}

/// Why a wait for tokens ([`RateLimiter::wait`](crate::RateLimiter::wait),
/// [`TickLimiter::wait`](crate::TickLimiter::wait), ...) ended without them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitError {
    /// The caller's token was cancelled; no token was consumed.
    Cancelled,
    /// The limiter was closed.
    Closed,
    /// More tokens than the burst were requested: it could never be granted.
    ExceedsBurst {
        /// Tokens requested.
        requested: u32,
        /// The limiter's burst.
        burst: u32,
    },
    /// The tokens would come later than the wait's deadline
    /// ([`RateLimiter::wait_n_within`](crate::RateLimiter::wait_n_within)); nothing was taken.
    WouldExceedDeadline {
        /// How long the wait would have been from when it gave up.
        wait: Duration,
    },
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitError::Cancelled => f.write_str("wait cancelled"),
            WaitError::Closed => f.write_str("limiter closed"),
            WaitError::ExceedsBurst { requested, burst } => {
                write!(f, "requested {requested} tokens of a burst of {burst}")
            }
            WaitError::WouldExceedDeadline { wait } => {
                write!(f, "the tokens would come after the deadline (in {wait:?})")
            }
        }
    }
}

impl Error for WaitError {}
