//! Resizing live: `Semaphore::resize`, `add_permits` and `forget_permits`.

use super::Semaphore;
use crate::state::MAX_PERMITS;

impl Semaphore {
    /// Changes the capacity. Growing frees new permits at once (to waiters first). Shrinking
    /// takes free permits away at once and retires held ones as they are released; permits
    /// already held stay valid. A waiter asking for more than the new capacity fails with
    /// [`AcquireError::TooLarge`](crate::AcquireError::TooLarge).
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_semaphore::Semaphore;
    ///
    /// let semaphore = Semaphore::new(4);
    /// let held = semaphore.try_acquire_many(3).unwrap();
    /// semaphore.resize(2);
    /// assert_eq!((semaphore.capacity(), semaphore.available(), semaphore.in_use()), (2, 0, 3));
    /// drop(held);
    /// assert_eq!((semaphore.available(), semaphore.in_use()), (2, 0));
    /// semaphore.resize(5);
    /// assert_eq!(semaphore.available(), 5);
    /// ```
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is zero or larger than [`MAX_PERMITS`](Self::MAX_PERMITS).
    pub fn resize(&self, capacity: usize) {
        check_capacity("Semaphore::resize", capacity);
        self.inner.state.resize(|_| capacity);
    }

    /// Adds `permits` to the capacity, in one step with any concurrent change (two callers
    /// adding 1 each grow it by 2, where `resize(capacity() + 1)` twice may grow it by 1).
    /// Returns the new capacity.
    ///
    /// # Panics
    ///
    /// Panics if the capacity would exceed [`MAX_PERMITS`](Self::MAX_PERMITS).
    pub fn add_permits(&self, permits: usize) -> usize {
        self.inner.state.resize(|old| {
            let new = old.saturating_add(permits);
            check_capacity("Semaphore::add_permits", new);
            new
        })
    }

    /// Takes `permits` off the capacity (saturating at 1), in one step with any concurrent
    /// change: free permits go at once, held ones are retired as they come back. Returns the
    /// new capacity.
    pub fn forget_permits(&self, permits: usize) -> usize {
        self.inner
            .state
            .resize(|old| old.saturating_sub(permits).max(1))
    }
}

#[track_caller]
fn check_capacity(what: &str, capacity: usize) {
    assert!(capacity > 0, "{what}: capacity must be greater than zero");
    assert!(
        capacity <= MAX_PERMITS,
        "{what}: capacity must be at most {MAX_PERMITS}"
    );
}
