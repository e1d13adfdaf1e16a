//! Tying a semaphore to its token: `Semaphore::with_token`, which closes it on cancellation.

use std::sync::Arc;

use taskweave_supervise::TokenWatch;
use tokio_util::sync::CancellationToken;

use super::Semaphore;

impl Semaphore {
    /// Ties the semaphore to `token`, the lifetime of what it guards (the application's or a
    /// component's token): when `token` is cancelled, the semaphore closes (inside the
    /// `cancel()` call), so every waiter wakes and later acquires fail. A waiter whose own
    /// token is cancelled gets [`AcquireError::Cancelled`](crate::AcquireError::Cancelled), the
    /// others [`AcquireError::Closed`](crate::AcquireError::Closed).
    ///
    /// It also makes waits on `token` itself cheaper: `acquire(&token)` on the bound token
    /// registers nothing on it and checks nothing of it, because the close ends the wait. A
    /// wait on any other token (a request's child token, say) checks and registers on that
    /// token, which is what a contended `acquire` costs above tokio's (see
    /// `docs/benchmarks.md`). No task is spawned: this works outside a runtime too.
    ///
    /// The price of checking nothing: the close lands when tokio-util wakes the token's
    /// waiters, inside `cancel()` but just after it has marked the token cancelled. An
    /// `acquire(&token)` that starts after `cancel()` has returned always gets `Closed` or
    /// `Cancelled`; one on another thread that sees `token.is_cancelled()` while that
    /// `cancel()` is still running may still be granted. To rule that out, acquire with a
    /// child of the bound token (checked, as above).
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
    /// assert!(api.is_closed(), "closed inside cancel()");
    /// assert_eq!(waiter.await.unwrap(), Err(AcquireError::Cancelled));
    /// drop(held);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics if the semaphore was already cloned or tied to a token (tie it right after
    /// construction).
    #[must_use]
    #[track_caller]
    pub fn with_token(mut self, token: CancellationToken) -> Self {
        assert!(
            self.inner.bound.is_none(),
            "Semaphore::with_token: the semaphore is already tied to a token"
        );
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            panic!("Semaphore::with_token: tie the semaphore to its token before cloning it");
        };
        inner.bound = Some(token.clone());
        let weak = Arc::downgrade(&self.inner);
        let watch = TokenWatch::with_hook(&token, move || {
            if let Some(inner) = weak.upgrade() {
                inner.state.close();
            }
        });
        // Set once: `bound` was `None`, so nobody set it before.
        let _ = self.inner._watch.set(watch);
        self
    }
}
