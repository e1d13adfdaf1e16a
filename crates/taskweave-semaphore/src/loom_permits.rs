//! A loom model of the permit word of `tokio::sync::Semaphore`, for the loom models only.
//!
//! `release` relies on how tokio orders its permit word (see `Inner::settle_debt`), and
//! loom cannot see tokio's atomics. This model does, with tokio's orderings as of tokio 1.54
//! (`sync/batch_semaphore.rs`): permits shifted left by one with the low bit for "closed";
//! every change a read-modify-write (add: `fetch_add` `Release`; take and forget:
//! `compare_exchange` `AcqRel`; close: `fetch_or` `Release`); reads `Acquire`.
//!
//! The model leaves out tokio's wait list and the mutex that guards it: the loom models
//! never wait, and leaving a lock out only removes orderings, so a protocol correct here is
//! correct with it. The paths through the wait list (permits handed to a waiter, a dropped
//! wait giving back part of its permits) are argued on `Inner::settle_debt`, not modelled.

use loom::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::TryAcquireError;

const CLOSED: usize = 1;
const SHIFT: usize = 1;

/// The modelled semaphore: only the operations `Inner` uses.
pub(crate) struct Semaphore {
    permits: AtomicUsize,
}

/// A permit taken from the model; `Inner` forgets every one at once.
pub(crate) struct SemaphorePermit<'a>(std::marker::PhantomData<&'a ()>);

impl SemaphorePermit<'_> {
    pub(crate) fn forget(self) {}
}

/// The semaphore was closed (tokio's `AcquireError` cannot be built outside tokio).
#[derive(Debug)]
pub(crate) struct Closed;

impl Semaphore {
    pub(crate) const MAX_PERMITS: usize = usize::MAX >> 3;

    pub(crate) fn new(permits: usize) -> Self {
        Semaphore {
            permits: AtomicUsize::new(permits << SHIFT),
        }
    }

    pub(crate) fn available_permits(&self) -> usize {
        self.permits.load(Ordering::Acquire) >> SHIFT
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.permits.load(Ordering::Acquire) & CLOSED == CLOSED
    }

    pub(crate) fn close(&self) {
        self.permits.fetch_or(CLOSED, Ordering::Release);
    }

    pub(crate) fn add_permits(&self, n: usize) {
        if n == 0 {
            return;
        }
        self.permits.fetch_add(n << SHIFT, Ordering::Release);
    }

    pub(crate) fn try_acquire_many(&self, n: u32) -> Result<SemaphorePermit<'_>, TryAcquireError> {
        let needed = (n as usize) << SHIFT;
        let mut current = self.permits.load(Ordering::Acquire);
        loop {
            if current & CLOSED == CLOSED {
                return Err(TryAcquireError::Closed);
            }
            if current < needed {
                return Err(TryAcquireError::NoPermits);
            }
            match self.permits.compare_exchange(
                current,
                current - needed,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(SemaphorePermit(std::marker::PhantomData)),
                Err(actual) => current = actual,
            }
        }
    }

    /// The models never wait: a wait is only the attempt, and it panics where tokio would
    /// queue.
    pub(crate) async fn acquire_many(&self, n: u32) -> Result<SemaphorePermit<'_>, Closed> {
        match self.try_acquire_many(n) {
            Ok(permit) => Ok(permit),
            Err(TryAcquireError::Closed) => Err(Closed),
            Err(TryAcquireError::NoPermits) => panic!("the loom models never wait for permits"),
        }
    }

    pub(crate) fn forget_permits(&self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let mut current = self.permits.load(Ordering::Acquire);
        loop {
            let free = current >> SHIFT;
            let left = free.saturating_sub(n);
            match self.permits.compare_exchange_weak(
                current,
                (left << SHIFT) | (current & CLOSED),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return free.min(n),
                Err(actual) => current = actual,
            }
        }
    }
}
