//! RAII permits: released on drop, so a forgotten release cannot leak a slot.

use std::fmt;
use std::sync::Arc;

use crate::semaphore::Inner;

/// Permits borrowed from a [`Semaphore`](crate::Semaphore), released when dropped.
#[must_use = "the permits are released as soon as this is dropped"]
pub struct Permit<'a> {
    inner: &'a Inner,
    permits: usize,
}

/// Permits of a [`Semaphore`](crate::Semaphore) that own a reference to it, for `'static`
/// use (moving into a spawned task); released when dropped.
#[must_use = "the permits are released as soon as this is dropped"]
pub struct OwnedPermit {
    inner: Arc<Inner>,
    permits: usize,
}

impl<'a> Permit<'a> {
    #[inline]
    pub(crate) fn new(inner: &'a Inner, permits: usize) -> Self {
        Permit { inner, permits }
    }

    /// How many permits this holds.
    #[must_use]
    pub fn num_permits(&self) -> usize {
        self.permits
    }

    /// Gives the permits up for good: the semaphore's capacity shrinks by as many (forgetting
    /// the last one closes the semaphore). For a resource that is gone (a connection that
    /// died), not as a way to skip the release.
    pub fn forget(mut self) {
        self.inner.state.forget(std::mem::take(&mut self.permits));
    }

    /// Takes `other`'s permits into this one, as tokio's `SemaphorePermit::merge`.
    ///
    /// # Panics
    ///
    /// Panics if `other` is of another semaphore, or the sum overflows a `usize`.
    pub fn merge(&mut self, mut other: Permit<'a>) {
        assert!(
            std::ptr::eq(self.inner, other.inner),
            "Permit::merge: the permits are of different semaphores"
        );
        self.permits = self
            .permits
            .checked_add(std::mem::take(&mut other.permits))
            .expect("Permit::merge: more than usize::MAX permits");
    }

    /// Splits `permits` off into a permit of their own, or `None` (nothing changed) if this
    /// holds fewer.
    pub fn split(&mut self, permits: usize) -> Option<Permit<'a>> {
        self.permits = self.permits.checked_sub(permits)?;
        Some(Permit::new(self.inner, permits))
    }
}

impl OwnedPermit {
    #[inline]
    pub(crate) fn new(inner: Arc<Inner>, permits: usize) -> Self {
        OwnedPermit { inner, permits }
    }

    /// How many permits this holds.
    #[must_use]
    pub fn num_permits(&self) -> usize {
        self.permits
    }

    /// Gives the permits up for good: the semaphore's capacity shrinks by as many.
    pub fn forget(mut self) {
        self.inner.state.forget(std::mem::take(&mut self.permits));
    }

    /// Takes `other`'s permits into this one, as tokio's `OwnedSemaphorePermit::merge`.
    ///
    /// # Panics
    ///
    /// Panics if `other` is of another semaphore, or the sum overflows a `usize`.
    pub fn merge(&mut self, mut other: OwnedPermit) {
        assert!(
            Arc::ptr_eq(&self.inner, &other.inner),
            "OwnedPermit::merge: the permits are of different semaphores"
        );
        self.permits = self
            .permits
            .checked_add(std::mem::take(&mut other.permits))
            .expect("OwnedPermit::merge: more than usize::MAX permits");
    }

    /// Splits `permits` off into a permit of their own, or `None` (nothing changed) if this
    /// holds fewer.
    pub fn split(&mut self, permits: usize) -> Option<OwnedPermit> {
        self.permits = self.permits.checked_sub(permits)?;
        Some(OwnedPermit::new(Arc::clone(&self.inner), permits))
    }
}

impl Drop for Permit<'_> {
    #[inline]
    fn drop(&mut self) {
        self.inner.state.release(self.permits);
    }
}

impl Drop for OwnedPermit {
    #[inline]
    fn drop(&mut self) {
        self.inner.state.release(self.permits);
    }
}

impl fmt::Debug for Permit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("permits", &self.permits)
            .finish()
    }
}

impl fmt::Debug for OwnedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedPermit")
            .field("permits", &self.permits)
            .finish()
    }
}
