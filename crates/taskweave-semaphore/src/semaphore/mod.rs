//! `Semaphore`: a fair, cancellable, resizable semaphore with a state of its own.

mod resize;
mod token;

use std::fmt;
use std::sync::{Arc, OnceLock};

use taskweave_supervise::TokenWatch;
use tokio_util::sync::CancellationToken;

use crate::acquire::{Acquire, AcquireOwned};
use crate::state::{MAX_PERMITS, State};
use crate::{AcquireError, OwnedPermit, Permit, TryAcquireError};

/// A counting and weighted semaphore: at most `capacity` permits are out at once.
///
/// - [`acquire`](Self::acquire) / [`acquire_many`](Self::acquire_many) wait for permits or the
///   caller's token, and say which ended the wait: [`AcquireError::Cancelled`] or
///   [`AcquireError::Closed`]. A request larger than the whole capacity fails at once with
///   [`AcquireError::TooLarge`] instead of waiting for ever at the head of the queue.
/// - **A cancellation observed before the permits are handed over wins**: a token already
///   cancelled gets `Cancelled` even when permits are free, and a waiter whose token is
///   cancelled before it takes its grant gets `Cancelled` too, its permits going to the
///   waiters behind it (Go's `x/sync/semaphore` rule since golang/go#63615).
/// - Permits are RAII values ([`Permit`], or [`OwnedPermit`] for `'static` use): dropping one
///   releases it, so an early return or a panic cannot leak a slot.
/// - **First come, first served**, weighted requests included: a request for 5 permits is not
///   starved by a stream of requests for 1. So [`try_acquire`](Self::try_acquire) fails while
///   others are waiting, even if enough permits are free for it.
/// - A waiter that gives up (its token, or its future dropped) hands what it had been
///   assigned to the waiters behind it; no permit is ever lost.
/// - [`close`](Self::close) wakes every waiter with `Closed`; `Closed` is reported before any
///   size error.
/// - Observers: [`in_use`](Self::in_use) (the saturation metric), [`available`](Self::available),
///   [`capacity`](Self::capacity). [`resize`](Self::resize), [`add_permits`](Self::add_permits)
///   and [`forget_permits`](Self::forget_permits) change it live without touching permits
///   already held: a shrink below what is held retires permits as they come back, and no
///   grant ever takes the holders past the capacity of the moment.
///
/// `Semaphore` is a cheap handle: clones share the permits. The futures are named
/// ([`Acquire`], [`AcquireOwned`]); [`PollSemaphore`](crate::PollSemaphore) gives a
/// `poll_acquire` for a hand-written future or a tower layer.
///
/// # Comparison to tokio's `Semaphore`
///
/// The state is this crate's own (one atomic word for the free permits and a wait list under a
/// mutex, checked by loom models of this code), not tokio's: a shrink that must retire held
/// permits needs the free count and the debt to change together, which tokio's API cannot
/// offer without relying on how it orders its private permit word. A release that nobody
/// waits for is one compare-and-swap (tokio's takes its wait-list lock every time).
///
/// | | tokio | taskweave |
/// |---|---|---|
/// | cancel a wait | drop the future (in a `select!` you write) | pass a token; `Cancelled` tells it apart from `Closed` |
/// | request above the capacity | waits for ever, blocking everyone behind it | `TooLarge` at once |
/// | shrink while permits are held | `forget_permits` only removes free ones | `resize` / `forget_permits` retire held permits as they come back |
/// | saturation | `available_permits` only | `in_use`, `capacity`, `available` |
/// | share it | wrap it in an `Arc` | `Clone`; `acquire_owned` needs no `Arc` |
/// | `Semaphore::new(0)` | a gate that `add_permits` opens | a panic: a semaphore of no permits refuses everything with `TooLarge` (and one whose last permit is forgotten closes); use `tokio::sync::Notify` or a watch channel for a gate |
///
/// # Examples
///
/// At most 10 calls to an external API at a time, from request handlers that are not ours:
///
/// ```
/// use taskweave_semaphore::{AcquireError, Semaphore};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let api = Semaphore::new(10);
/// let request = CancellationToken::new();
/// let permit = api.acquire(&request).await.unwrap();
/// assert_eq!((api.in_use(), api.available()), (1, 9));
/// drop(permit);
/// assert_eq!(api.in_use(), 0);
///
/// assert_eq!(
///     api.acquire_many(&request, 11).await.unwrap_err(),
///     AcquireError::TooLarge { requested: 11, capacity: 10 }
/// );
/// # }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) state: State,
    /// The token this semaphore closes on ([`Semaphore::with_token`]). A wait on this very
    /// token needs no registration of its own: the close ends it.
    bound: Option<CancellationToken>,
    /// Closes the semaphore inside the bound token's `cancel()` (a waker on the token, no
    /// task): set once by `with_token`.
    _watch: OnceLock<TokenWatch>,
}

impl Semaphore {
    /// The most permits a semaphore can have: `usize::MAX >> 3`, as tokio's.
    pub const MAX_PERMITS: usize = MAX_PERMITS;

    /// A semaphore with `capacity` permits.
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is zero (every acquire would be `TooLarge`: see the comparison
    /// table above for a gate) or larger than [`MAX_PERMITS`](Self::MAX_PERMITS).
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        assert!(
            capacity > 0,
            "Semaphore::new: capacity must be greater than zero"
        );
        assert!(
            capacity <= MAX_PERMITS,
            "Semaphore::new: capacity must be at most {MAX_PERMITS}"
        );
        Semaphore {
            inner: Arc::new(Inner {
                state: State::new(capacity),
                bound: None,
                _watch: OnceLock::new(),
            }),
        }
    }

    /// Waits for one permit, unless `token` is cancelled first (a token already cancelled
    /// gets [`AcquireError::Cancelled`] even when a permit is free).
    ///
    /// # Errors
    ///
    /// [`AcquireError::Cancelled`] or [`AcquireError::Closed`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future gives up the place in the queue, and whatever had
    /// already been assigned to it goes to the next waiter.
    pub fn acquire<'a>(&'a self, token: &'a CancellationToken) -> Acquire<'a> {
        self.acquire_many(token, 1)
    }

    /// Waits for `permits` permits at once, unless `token` is cancelled first.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Cancelled`], [`AcquireError::Closed`], or [`AcquireError::TooLarge`]
    /// when `permits` exceeds the capacity (at once, or when a resize shrinks it while
    /// waiting).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub fn acquire_many<'a>(&'a self, token: &'a CancellationToken, permits: usize) -> Acquire<'a> {
        Acquire::new(self, token, permits)
    }

    /// [`acquire`](Self::acquire) for a permit that can move into a spawned task; the future
    /// is `'static` too (it holds a clone of the handle and of `token`).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub fn acquire_owned(&self, token: &CancellationToken) -> AcquireOwned {
        self.acquire_many_owned(token, 1)
    }

    /// [`acquire_many`](Self::acquire_many) for permits that can move into a spawned task.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub fn acquire_many_owned(&self, token: &CancellationToken, permits: usize) -> AcquireOwned {
        AcquireOwned::new(self.clone(), token.clone(), permits)
    }

    /// One permit, if one is free now and nobody is waiting before us.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::NoPermits`] or [`TryAcquireError::Closed`].
    #[inline]
    pub fn try_acquire(&self) -> Result<Permit<'_>, TryAcquireError> {
        self.try_acquire_many(1)
    }

    /// `permits` permits, if free now and nobody is waiting before us.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Closed`] (checked first), [`TryAcquireError::TooLarge`], or
    /// [`TryAcquireError::NoPermits`].
    #[inline]
    pub fn try_acquire_many(&self, permits: usize) -> Result<Permit<'_>, TryAcquireError> {
        self.inner.state.try_acquire(permits)?;
        Ok(Permit::new(&self.inner, permits))
    }

    /// [`try_acquire`](Self::try_acquire) for a permit that can move into a task.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    #[inline]
    pub fn try_acquire_owned(&self) -> Result<OwnedPermit, TryAcquireError> {
        self.try_acquire_many_owned(1)
    }

    /// [`try_acquire_many`](Self::try_acquire_many) for permits that can move into a task.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    #[inline]
    pub fn try_acquire_many_owned(&self, permits: usize) -> Result<OwnedPermit, TryAcquireError> {
        self.inner.state.try_acquire(permits)?;
        Ok(OwnedPermit::new(Arc::clone(&self.inner), permits))
    }

    /// Closes the semaphore: every waiter wakes with `Closed`, and later acquires fail.
    /// Permits already held stay valid.
    pub fn close(&self) {
        self.inner.state.close();
    }

    /// `true` after [`close`](Self::close) (or the bound token's cancellation, or forgetting
    /// the last permit).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.inner.state.is_closed()
    }

    /// The total number of permits.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.inner.state.capacity()
    }

    /// Permits free now.
    #[must_use]
    pub fn available(&self) -> usize {
        self.inner.state.available()
    }

    /// Permits free now: [`available`](Self::available) under tokio's name.
    #[must_use]
    pub fn available_permits(&self) -> usize {
        self.available()
    }

    /// Permits held (or already assigned to a waiter): the saturation metric. Can exceed the
    /// capacity for a while after a shrink, until the extra permits come back.
    #[must_use]
    pub fn in_use(&self) -> usize {
        self.inner.state.in_use()
    }
}

impl Inner {
    /// Why a wait on `token` found the semaphore closed: on a semaphore tied to a token
    /// (which closes it), a cancelled caller token says `Cancelled`.
    pub(crate) fn closed(&self, token: &CancellationToken) -> AcquireError {
        if self.bound.is_some() && token.is_cancelled() {
            AcquireError::Cancelled
        } else {
            AcquireError::Closed
        }
    }

    /// `true` when a wait on `token` must watch it itself: any token but the bound one.
    pub(crate) fn watches(&self, token: &CancellationToken) -> bool {
        self.bound.as_ref() != Some(token)
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("capacity", &self.capacity())
            .field("available", &self.available())
            .field("in_use", &self.in_use())
            .field("closed", &self.is_closed())
            .finish()
    }
}
