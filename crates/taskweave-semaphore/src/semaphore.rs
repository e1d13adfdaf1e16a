//! `Semaphore`: a fair, cancellable, resizable semaphore built on tokio's.

use std::fmt;
use std::sync::{Arc, PoisonError, Weak};

#[cfg(all(test, taskweave_loom))]
use loom::sync::{
    Mutex,
    atomic::{AtomicBool, AtomicUsize, Ordering},
};
#[cfg(not(all(test, taskweave_loom)))]
use std::sync::{
    Mutex,
    atomic::{AtomicBool, AtomicUsize, Ordering},
};

#[cfg(all(test, taskweave_loom))]
use crate::loom_permits::{Semaphore as Permits, SemaphorePermit as PermitsPermit};
use tokio::sync::{Notify, TryAcquireError as TokioTryAcquireError};
#[cfg(not(all(test, taskweave_loom)))]
use tokio::sync::{Semaphore as Permits, SemaphorePermit as PermitsPermit};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::{AcquireError, OwnedPermit, Permit, TryAcquireError};

/// A counting and weighted semaphore: at most `capacity` permits are out at once.
///
/// - [`acquire`](Self::acquire) / [`acquire_many`](Self::acquire_many) wait for permits or the
///   caller's token, and say which ended the wait: [`AcquireError::Cancelled`] or
///   [`AcquireError::Closed`]. A request larger than the whole capacity fails at once with
///   [`AcquireError::TooLarge`] instead of waiting for ever at the head of the queue.
/// - Permits are RAII values ([`Permit`], or [`OwnedPermit`] for `'static` use): dropping one
///   releases it, so an early return or a panic cannot leak a slot.
/// - **First come, first served**, weighted requests included: a request for 5 permits is not
///   starved by a stream of requests for 1. So [`try_acquire`](Self::try_acquire) fails while
///   others are waiting, even if enough permits are free for it.
/// - A waiter that gives up (its token, or its future dropped) at the head of the queue hands
///   what it had been assigned to the waiters behind it; a permit granted at the same instant
///   as the cancellation is returned, never lost.
/// - [`close`](Self::close) wakes every waiter with `Closed`.
/// - Observers: [`in_use`](Self::in_use) (the saturation metric), [`available`](Self::available),
///   [`capacity`](Self::capacity); [`resize`](Self::resize) grows or shrinks it live without
///   touching permits already held.
///
/// `Semaphore` is a cheap handle: clones share the permits.
///
/// # Comparison to tokio's `Semaphore`
///
/// This type is built on `tokio::sync::Semaphore`, which already queues fairly, hands permits
/// of a cancelled waiter on, and never loses one. What it adds:
///
/// | | tokio | taskweave |
/// |---|---|---|
/// | cancel a wait | drop the future (in a `select!` you write) | pass a token; `Cancelled` tells it apart from `Closed` |
/// | request above the capacity | waits for ever, blocking everyone behind it | `TooLarge` at once |
/// | shrink while permits are held | `forget_permits` only removes free ones | `resize` retires held permits as they come back |
/// | saturation | `available_permits` only | `in_use`, `capacity`, `available` |
/// | share it | wrap it in an `Arc` | `Clone`; `acquire_owned` needs no `Arc` |
///
/// Use tokio's directly when none of this matters to you: it is what this one costs on top
/// (see `docs/benchmarks.md`).
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
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// tokio's semaphore (a model of its permit word in the loom models).
    semaphore: Permits,
    capacity: AtomicUsize,
    /// Permits to retire as they are released: a shrink below the permits in use.
    debt: AtomicUsize,
    /// Wakes weighted waiters after a shrink, so that one asking for more than the new
    /// capacity fails with `TooLarge` instead of waiting for ever.
    resized: Notify,
    /// Serialises resizes (rare), so capacity and debt change together.
    resize_lock: Mutex<()>,
    /// The token this semaphore closes on ([`Semaphore::with_token`]). A wait on this very
    /// token needs no registration of its own: the close ends it.
    bound: Option<CancellationToken>,
    /// `true` while the task watching `bound` runs. It is `false` if the runtime it was
    /// spawned on shut down, and then waits on `bound` register on it like any other token.
    watching: AtomicBool,
    /// Stops the task that watches `bound` when the semaphore goes away.
    _stop_watch: Option<DropGuard>,
}

impl Semaphore {
    /// A semaphore with `capacity` permits.
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is zero (every acquire would wait for ever) or larger than
    /// tokio's maximum (`usize::MAX >> 3`).
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        assert!(
            capacity > 0,
            "Semaphore::new: capacity must be greater than zero"
        );
        assert!(
            capacity <= Permits::MAX_PERMITS,
            "Semaphore::new: capacity must be at most {}",
            Permits::MAX_PERMITS
        );
        Semaphore {
            inner: Arc::new(Inner {
                semaphore: Permits::new(capacity),
                capacity: AtomicUsize::new(capacity),
                debt: AtomicUsize::new(0),
                resized: Notify::new(),
                resize_lock: Mutex::new(()),
                bound: None,
                watching: AtomicBool::new(false),
                _stop_watch: None,
            }),
        }
    }

    /// Ties the semaphore to `token`, the lifetime of what it guards (the application's or a
    /// component's token): when `token` is cancelled, the semaphore closes, so every waiter
    /// wakes and later acquires fail. A waiter whose own token is cancelled gets
    /// [`AcquireError::Cancelled`], the others [`AcquireError::Closed`].
    ///
    /// It also makes waits on `token` itself cheaper: `acquire(&token)` on the bound token
    /// registers nothing on it, because the close ends the wait. A wait on any other token
    /// (a request's child token, say) registers on that token for the length of the wait,
    /// which is what a contended `acquire` costs above tokio's (see `docs/benchmarks.md`).
    ///
    /// The watch is one small task on the runtime this is called in, which ends when the
    /// token is cancelled or the last handle to the semaphore is dropped. That runtime must
    /// be running for the close to happen; if it shuts down first, a thread of its own takes
    /// the watch over.
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_semaphore::{AcquireError, Semaphore};
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let shutdown = CancellationToken::new();
    /// let api = Semaphore::new(1).with_token(shutdown.clone());
    /// let held = api.acquire(&shutdown).await.unwrap();
    ///
    /// let waiter = {
    ///     let (api, shutdown) = (api.clone(), shutdown.clone());
    ///     tokio::spawn(async move { api.acquire(&shutdown).await.map(drop) })
    /// };
    /// tokio::task::yield_now().await;
    /// shutdown.cancel();
    /// assert_eq!(waiter.await.unwrap(), Err(AcquireError::Cancelled));
    /// assert!(api.is_closed());
    /// drop(held);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics if the semaphore was already cloned (tie it right after construction), or
    /// outside a tokio runtime (the watch is a task).
    #[must_use]
    #[track_caller]
    pub fn with_token(mut self, token: CancellationToken) -> Self {
        assert!(
            tokio::runtime::Handle::try_current().is_ok(),
            "Semaphore::with_token: must be called inside a tokio runtime"
        );
        assert!(
            self.inner.bound.is_none(),
            "Semaphore::with_token: the semaphore is already tied to a token"
        );
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            panic!("Semaphore::with_token: tie the semaphore to its token before cloning it");
        };
        // Cancelled with `token`, or when the semaphore drops (the guard lives in `Inner`).
        let stop = token.child_token();
        inner._stop_watch = Some(stop.clone().drop_guard());
        inner.bound = Some(token.clone());
        inner.watching = AtomicBool::new(true);
        let weak = Arc::downgrade(&self.inner);
        drop(taskweave_supervise::spawn(
            "semaphore-token-watch",
            watch(token, stop, weak),
        ));
        self
    }

    /// Waits for one permit, unless `token` is cancelled first.
    ///
    /// A permit that is free at once is granted without looking at the token; the token only
    /// interrupts a wait.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Cancelled`] or [`AcquireError::Closed`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future gives up the place in the queue, and whatever had
    /// already been assigned to it goes to the next waiter.
    pub async fn acquire(&self, token: &CancellationToken) -> Result<Permit<'_>, AcquireError> {
        self.acquire_many(token, 1).await
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
    pub async fn acquire_many(
        &self,
        token: &CancellationToken,
        permits: u32,
    ) -> Result<Permit<'_>, AcquireError> {
        self.inner.acquire(token, permits).await?;
        Ok(Permit::new(&self.inner, permits))
    }

    /// [`acquire`](Self::acquire) for a permit that can move into a spawned task.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn acquire_owned(
        &self,
        token: &CancellationToken,
    ) -> Result<OwnedPermit, AcquireError> {
        self.acquire_many_owned(token, 1).await
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
    pub async fn acquire_many_owned(
        &self,
        token: &CancellationToken,
        permits: u32,
    ) -> Result<OwnedPermit, AcquireError> {
        self.inner.acquire(token, permits).await?;
        Ok(OwnedPermit::new(Arc::clone(&self.inner), permits))
    }

    /// One permit, if one is free now and nobody is waiting before us.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::NoPermits`] or [`TryAcquireError::Closed`].
    pub fn try_acquire(&self) -> Result<Permit<'_>, TryAcquireError> {
        self.try_acquire_many(1)
    }

    /// `permits` permits, if free now and nobody is waiting before us.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::NoPermits`], [`TryAcquireError::Closed`], or
    /// [`TryAcquireError::TooLarge`].
    pub fn try_acquire_many(&self, permits: u32) -> Result<Permit<'_>, TryAcquireError> {
        self.inner.try_acquire(permits)?;
        Ok(Permit::new(&self.inner, permits))
    }

    /// [`try_acquire`](Self::try_acquire) for a permit that can move into a task.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub fn try_acquire_owned(&self) -> Result<OwnedPermit, TryAcquireError> {
        self.try_acquire_many_owned(1)
    }

    /// [`try_acquire_many`](Self::try_acquire_many) for permits that can move into a task.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    pub fn try_acquire_many_owned(&self, permits: u32) -> Result<OwnedPermit, TryAcquireError> {
        self.inner.try_acquire(permits)?;
        Ok(OwnedPermit::new(Arc::clone(&self.inner), permits))
    }

    /// Closes the semaphore: every waiter wakes with `Closed`, and later acquires fail.
    /// Permits already held stay valid.
    pub fn close(&self) {
        self.inner.close();
    }

    /// `true` after [`close`](Self::close).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.inner.semaphore.is_closed()
    }

    /// The total number of permits.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.inner.capacity.load(Ordering::Acquire)
    }

    /// Permits free now.
    #[must_use]
    pub fn available(&self) -> usize {
        self.inner.semaphore.available_permits()
    }

    /// Permits held (or already assigned to a waiter): the saturation metric. Can exceed the
    /// capacity for a while after a shrink, until the extra permits come back. Read without a
    /// lock, so during a resize it may be briefly off.
    #[must_use]
    pub fn in_use(&self) -> usize {
        let capacity = self.capacity();
        let debt = self.inner.debt.load(Ordering::Acquire);
        (capacity + debt).saturating_sub(self.available())
    }

    /// Changes the capacity. Growing frees new permits at once (to waiters first). Shrinking
    /// takes free permits away at once and retires held ones as they are released; permits
    /// already held stay valid. A waiter asking for more than the new capacity fails with
    /// [`AcquireError::TooLarge`].
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
    /// Panics if `capacity` is zero or larger than tokio's maximum.
    pub fn resize(&self, capacity: usize) {
        assert!(
            capacity > 0,
            "Semaphore::resize: capacity must be greater than zero"
        );
        assert!(
            capacity <= Permits::MAX_PERMITS,
            "Semaphore::resize: capacity must be at most {}",
            Permits::MAX_PERMITS
        );
        self.inner.resize(capacity);
    }
}

impl Inner {
    fn close(&self) {
        self.semaphore.close();
        self.resized.notify_waiters();
    }

    /// Why a wait on `token` found the semaphore closed: on a semaphore tied to a token
    /// (which closes it), a cancelled caller token says `Cancelled`.
    fn closed(&self, token: &CancellationToken) -> AcquireError {
        if self.bound.is_some() && token.is_cancelled() {
            AcquireError::Cancelled
        } else {
            AcquireError::Closed
        }
    }

    fn check_size(&self, permits: u32) -> Result<(), (u32, usize)> {
        let capacity = self.capacity.load(Ordering::Acquire);
        if permits as usize > capacity {
            return Err((permits, capacity));
        }
        Ok(())
    }

    fn try_acquire(&self, permits: u32) -> Result<(), TryAcquireError> {
        // First: while a release races a shrink, free permits can exceed the new capacity
        // for a moment, and a request above the capacity must still be refused.
        self.check_size(permits)
            .map_err(|(requested, capacity)| TryAcquireError::TooLarge {
                requested,
                capacity,
            })?;
        match self.semaphore.try_acquire_many(permits) {
            Ok(permit) => {
                // Our `Permit` types do the releasing, so that a shrink can retire them.
                permit.forget();
                Ok(())
            }
            Err(TokioTryAcquireError::Closed) => Err(TryAcquireError::Closed),
            Err(TokioTryAcquireError::NoPermits) => Err(TryAcquireError::NoPermits),
        }
    }

    async fn acquire(&self, token: &CancellationToken, permits: u32) -> Result<(), AcquireError> {
        let too_large = |(requested, capacity)| AcquireError::TooLarge {
            requested,
            capacity,
        };
        // Fast path: no queue to join, no token to watch.
        match self.try_acquire(permits) {
            Ok(()) => return Ok(()),
            Err(TryAcquireError::Closed) => return Err(self.closed(token)),
            Err(TryAcquireError::TooLarge {
                requested,
                capacity,
            }) => {
                return Err(too_large((requested, capacity)));
            }
            Err(TryAcquireError::NoPermits) => {}
        }
        // Declared before the tokio future, so it drops after it: permits tokio had assigned
        // to this wait go back to tokio's pool when that future drops, and a shrink may still
        // be owed them.
        let mut settle = SettleDebt {
            inner: self,
            granted: false,
        };
        // The queue position lives in this future for the whole wait.
        let acquire = self.semaphore.acquire_many(permits);
        let mut acquire = std::pin::pin!(acquire);
        // The bound token closes the semaphore when cancelled, which ends the wait: watching
        // it here too would cost a registration on the token for nothing.
        let watch_token =
            self.bound.as_ref() != Some(token) || !self.watching.load(Ordering::Acquire);
        let mut granted = |acquired: Result<PermitsPermit<'_>, _>| match acquired {
            Ok(permit) => {
                permit.forget();
                settle.granted = true;
                Ok(())
            }
            Err(_closed) => Err(self.closed(token)),
        };
        if permits <= 1 && !watch_token {
            // Nothing to watch but the queue.
            return granted(acquire.await);
        }
        let cancelled = token.cancelled();
        let mut cancelled = std::pin::pin!(cancelled);
        if permits <= 1 {
            // A single permit can never exceed a capacity (at least 1): no resize to watch,
            // which saves a registration on every wait.
            return tokio::select! {
                biased;
                acquired = &mut acquire => granted(acquired),
                () = &mut cancelled => Err(AcquireError::Cancelled),
            };
        }
        loop {
            let resized = self.resized.notified();
            let mut resized = std::pin::pin!(resized);
            resized.as_mut().enable();
            // A shrink that happened before `enable` is seen here.
            self.check_size(permits).map_err(too_large)?;
            tokio::select! {
                biased;
                acquired = &mut acquire => return granted(acquired),
                () = &mut cancelled, if watch_token => return Err(AcquireError::Cancelled),
                () = resized => {
                    if self.semaphore.is_closed() {
                        return Err(self.closed(token));
                    }
                }
            }
        }
    }

    pub(crate) fn release(&self, permits: u32) {
        let unpaid = self.pay_debt(permits as usize);
        if unpaid > 0 {
            self.semaphore.add_permits(unpaid);
            // A shrink may have run between `pay_debt` and `add_permits`, found too few free
            // permits and left debt behind: settle it now (see `settle_debt`).
            self.settle_debt();
        }
    }

    /// Retires free permits against what a shrink still owes. Called after permits went
    /// back to tokio's pool (a release, or a wait dropped with part of its permits assigned);
    /// two plain loads when nothing is owed.
    ///
    /// The race it closes: a release adds permits (a write to tokio's permit word) then reads
    /// the debt; a shrink writes the debt then looks for free permits. Two plain loads could
    /// each miss the other's write (the store-buffering pattern) and leave permits free
    /// beyond the new capacity for as long as the others stay out. The loom model
    /// `a_shrink_racing_a_release_retires_exactly_what_it_owes` fails that way if the first
    /// load below is removed or made `Relaxed`, or if the shrink's `compare_exchange` loses
    /// its `Release` (each checked by hand in the model).
    ///
    /// What orders them without a read-modify-write of our own (one cost 1.06 → 1.37 ×
    /// tokio's `try_acquire` + release): every change to tokio's permit word is a
    /// read-modify-write (tokio 1.54, `batch_semaphore.rs`), and the shrink's last step
    /// after publishing its debt is one with `Release` ordering (`forget_permits`, a
    /// `compare_exchange` `AcqRel`). So either that step comes after our addition in the
    /// word's order and sees (and retires) our permits, or it comes before: then our
    /// addition continues its release sequence, the `Acquire` load below (which reads our
    /// addition or later) synchronises with it, and the debt load after it sees the debt.
    /// `loom_permits` models the word with exactly these orderings. Checked against tokio
    /// 1.54.1; `scripts/test` fails on any other tokio version until it is checked again.
    ///
    /// Permits a release hands straight to a queued waiter do not touch the word: nothing
    /// became free, and the waiter holds them until its own release pays the debt.
    pub(crate) fn settle_debt(&self) {
        if self.semaphore.available_permits() == 0 {
            // Nothing free to retire; later releases settle what they add.
            return;
        }
        if self.debt.load(Ordering::Acquire) == 0 {
            return;
        }
        let _guard = self
            .resize_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.settle_debt_locked();
    }

    /// [`settle_debt`](Self::settle_debt) with the resize lock held.
    fn settle_debt_locked(&self) {
        let debt = self.debt.load(Ordering::Acquire);
        if debt == 0 {
            return;
        }
        let retired = self.semaphore.forget_permits(debt);
        // Releases pay debt without the lock, so part of it may have been paid since the
        // load: pay what is still owed and give the rest back, never going below zero.
        let surplus = self.pay_debt(retired);
        if surplus > 0 {
            self.semaphore.add_permits(surplus);
        }
    }

    /// Permits given up for good: they retire what a shrink still owes, and the rest shrink
    /// the capacity. Forgetting the last permit closes the semaphore: nothing could ever be
    /// acquired again, and waiters must not wait for ever.
    pub(crate) fn forget(&self, permits: u32) {
        let guard = self
            .resize_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let unpaid = self.pay_debt(permits as usize);
        let capacity = self.capacity.load(Ordering::Acquire);
        let remaining = capacity.saturating_sub(unpaid);
        self.capacity.store(remaining, Ordering::Release);
        drop(guard);
        if remaining == 0 {
            self.semaphore.close();
        }
        // A weighted waiter may now ask for more than the capacity.
        self.resized.notify_waiters();
    }

    /// Uses up to `permits` to pay what a shrink still owes; returns what is left.
    fn pay_debt(&self, mut permits: usize) -> usize {
        // The common case, no shrink in progress, is one load.
        let mut debt = self.debt.load(Ordering::Acquire);
        while debt > 0 && permits > 0 {
            let paid = debt.min(permits);
            match self.debt.compare_exchange_weak(
                debt,
                debt - paid,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => permits -= paid,
                Err(current) => debt = current,
            }
        }
        permits
    }

    fn resize(&self, new: usize) {
        let _guard = self
            .resize_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let old = self.capacity.swap(new, Ordering::AcqRel);
        if new > old {
            // Cancel debt first: those permits are still out and will come back.
            let grow = self.pay_debt(new - old);
            if grow > 0 {
                self.semaphore.add_permits(grow);
            }
        } else if new < old {
            let shrink = old - new;
            let forgotten = self.semaphore.forget_permits(shrink);
            self.debt.fetch_add(shrink - forgotten, Ordering::AcqRel);
            // Permits a release added after `forget_permits`, having seen no debt yet.
            self.settle_debt_locked();
            self.resized.notify_waiters();
        }
    }
}

/// Closes the semaphore when `token` is cancelled; ends when the semaphore is dropped (its
/// drop guard cancels `stop`, a child of `token`).
///
/// The guard is built outside the `async` block, so that it also takes the watch over when
/// the task is dropped before its first poll.
fn watch(
    token: CancellationToken,
    stop: CancellationToken,
    inner: Weak<Inner>,
) -> impl Future<Output = ()> + Send + 'static {
    let mut watch = Watch {
        token,
        stop,
        inner,
        done: false,
    };
    async move {
        watch.stop.cancelled().await;
        watch.done = true;
        watch.close_if_cancelled();
    }
}

struct Watch {
    token: CancellationToken,
    stop: CancellationToken,
    inner: Weak<Inner>,
    done: bool,
}

impl Watch {
    fn close_if_cancelled(&self) {
        if self.token.is_cancelled()
            && let Some(inner) = self.inner.upgrade()
        {
            inner.close();
        }
    }
}

impl Drop for Watch {
    /// The watch task was dropped before it finished: its runtime shut down. Waits on the
    /// bound token rely on it, so a thread of its own takes over the watch; if no thread can
    /// be started, waits register on the token themselves from now on (`watching`).
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.token.is_cancelled() || self.inner.strong_count() == 0 {
            self.close_if_cancelled();
            return;
        }
        let (token, stop, inner) = (self.token.clone(), self.stop.clone(), self.inner.clone());
        let fallback = self.inner.clone();
        let spawned = std::thread::Builder::new()
            .name("semaphore-token-watch".into())
            .spawn(
                move || match tokio::runtime::Builder::new_current_thread().build() {
                    Ok(runtime) => runtime.block_on(watch(token, stop, inner)),
                    Err(_) => unwatched(&inner),
                },
            );
        if spawned.is_err() {
            unwatched(&fallback);
        }
    }
}

fn unwatched(inner: &Weak<Inner>) {
    if let Some(inner) = inner.upgrade() {
        inner.watching.store(false, Ordering::Release);
    }
}

/// Settles a shrink's debt when a wait ends without a grant (error, cancellation or drop).
struct SettleDebt<'a> {
    inner: &'a Inner,
    granted: bool,
}

impl Drop for SettleDebt<'_> {
    fn drop(&mut self) {
        if !self.granted {
            self.inner.settle_debt();
        }
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

/// Loom models of the shrink bookkeeping (`capacity`, `debt` and the resize lock) racing
/// releases: every interleaving, on loom's atomics and mutex. Run with
/// `RUSTFLAGS="--cfg taskweave_loom" cargo test -p taskweave-semaphore --lib`.
#[cfg(all(test, taskweave_loom))]
mod loom_models {
    use super::Semaphore;

    /// Every permit back, nothing owed: the books balance at `capacity`.
    fn assert_settled(semaphore: &Semaphore, capacity: usize) {
        assert_eq!(semaphore.capacity(), capacity);
        assert_eq!(semaphore.available(), capacity);
        assert_eq!(semaphore.in_use(), 0);
        assert_eq!(semaphore.inner.debt.load(super::Ordering::Acquire), 0);
    }

    /// `releases` + 1 permits held, all but one released on threads of their own while the
    /// semaphore shrinks to 1.
    fn shrink_to_one_racing(releases: usize) {
        let mut model = loom::model::Builder::new();
        if releases > 1 {
            // Three threads: the full search runs for hours; bounded at four preemptions it
            // takes seconds. The one-release model searches every interleaving.
            model.preemption_bound = Some(4);
        }
        model.check(move || {
            let semaphore = Semaphore::new(releases + 1);
            let kept = semaphore.try_acquire_owned().unwrap();
            let releasers: Vec<_> = (0..releases)
                .map(|_| semaphore.try_acquire_owned().unwrap())
                .map(|permit| loom::thread::spawn(move || drop(permit)))
                .collect();
            semaphore.resize(1);
            for releaser in releasers {
                releaser.join().unwrap();
            }
            // `kept` is still out and the capacity is now 1: nothing may be free, whichever
            // ran first (a release that came back after the shrink pays its debt).
            assert_eq!(semaphore.available(), 0);
            assert_eq!(semaphore.in_use(), 1);
            drop(kept);
            assert_settled(&semaphore, 1);
        });
    }

    #[test]
    fn a_shrink_racing_a_release_retires_exactly_what_it_owes() {
        shrink_to_one_racing(1);
    }

    #[test]
    fn a_shrink_racing_two_releases_never_owes_below_zero() {
        shrink_to_one_racing(2);
    }

    #[test]
    fn a_grow_racing_a_shrink_and_a_release_keeps_the_last_capacity() {
        loom::model(|| {
            let semaphore = Semaphore::new(2);
            let held = semaphore.try_acquire_many_owned(2).unwrap();
            let shrinker = {
                let semaphore = semaphore.clone();
                loom::thread::spawn(move || semaphore.resize(1))
            };
            let releaser = loom::thread::spawn(move || drop(held));
            shrinker.join().unwrap();
            releaser.join().unwrap();
            semaphore.resize(3);
            assert_settled(&semaphore, 3);
        });
    }

    #[test]
    fn forgetting_racing_a_shrink_pays_its_debt() {
        loom::model(|| {
            let semaphore = Semaphore::new(3);
            let kept = semaphore.try_acquire_owned().unwrap();
            let forgotten = semaphore.try_acquire_owned().unwrap();
            let forgetter = loom::thread::spawn(move || forgotten.forget());
            semaphore.resize(1);
            forgetter.join().unwrap();
            drop(kept);
            // Forgotten before the shrink, it lowers the capacity the shrink then sets;
            // after, it pays the shrink's debt. Either way the capacity ends at 1.
            assert_settled(&semaphore, 1);
        });
    }
}
