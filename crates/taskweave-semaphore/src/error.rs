//! Errors: why a permit was not granted.

use std::error::Error;
use std::fmt;

/// Why [`Semaphore::acquire`](crate::Semaphore::acquire) (or `acquire_many`) granted nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireError {
    /// The caller's token was cancelled while waiting.
    Cancelled,
    /// The semaphore was closed.
    Closed,
    /// More permits were requested than the semaphore has in total, so the request could
    /// never be granted (and, waiting at the head of the queue, would block everyone behind
    /// it). Also returned to a waiter when a resize shrinks the capacity below its request.
    TooLarge {
        /// Permits requested.
        requested: usize,
        /// The semaphore's capacity at the time.
        capacity: usize,
    },
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireError::Cancelled => f.write_str("acquire cancelled"),
            AcquireError::Closed => f.write_str("semaphore closed"),
            AcquireError::TooLarge {
                requested,
                capacity,
            } => write!(
                f,
                "requested {requested} permits of a semaphore of {capacity}"
            ),
        }
    }
}

impl Error for AcquireError {}

/// Why [`Semaphore::try_acquire`](crate::Semaphore::try_acquire) (or `try_acquire_many`)
/// granted nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TryAcquireError {
    /// Not enough permits are free now, or others are already waiting (first come, first
    /// served).
    NoPermits,
    /// The semaphore was closed.
    Closed,
    /// More permits were requested than the semaphore has in total.
    TooLarge {
        /// Permits requested.
        requested: usize,
        /// The semaphore's capacity at the time.
        capacity: usize,
    },
}

impl fmt::Display for TryAcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryAcquireError::NoPermits => f.write_str("no permits available"),
            TryAcquireError::Closed => f.write_str("semaphore closed"),
            TryAcquireError::TooLarge {
                requested,
                capacity,
            } => write!(
                f,
                "requested {requested} permits of a semaphore of {capacity}"
            ),
        }
    }
}

impl Error for TryAcquireError {}
