//! `TokenWatch`: a cancellation token watched by one waker, read with one atomic load.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;
use pin_project_lite::pin_project;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Watches a [`CancellationToken`] so that hot paths can check it with one atomic load.
///
/// `CancellationToken::is_cancelled` and polling `token.cancelled()` take the token's lock,
/// every time; in a loop that handles one item per check, that lock is most of the cost. A
/// `TokenWatch` registers a waker of its own on the token once. tokio-util runs that waker
/// inside `cancel()` (of the token or an ancestor), and it sets a flag, wakes the waker last
/// given to [`register`](Self::register), and runs an optional hook.
///
/// The flag follows the cancellation as soon as tokio-util has woken its waiters, which it
/// does before the `cancel()` call that caused it returns.
///
/// # Examples
///
/// ```
/// use taskweave_supervise::TokenWatch;
/// use tokio_util::sync::CancellationToken;
///
/// let token = CancellationToken::new();
/// let watch = TokenWatch::new(&token);
/// assert!(!watch.is_cancelled());
/// token.cancel();
/// assert!(watch.is_cancelled());
/// ```
pub struct TokenWatch {
    signal: Arc<Signal>,
    // Keeps our waker registered on the token.
    _watch: Pin<Box<WaitForCancellationFutureOwned>>,
}

struct Signal {
    cancelled: AtomicBool,
    waiter: AtomicWaker,
    on_cancel: Option<Box<dyn Fn() + Send + Sync>>,
}

impl TokenWatch {
    /// Watches `token`.
    #[must_use]
    pub fn new(token: &CancellationToken) -> Self {
        Self::build(token, None)
    }

    /// Watches `token` and runs `on_cancel` once when it is cancelled: synchronously, inside
    /// the `cancel()` call (or here, if the token is already cancelled). Keep it short; it
    /// must not block or cancel the same token. A panic in it is caught and logged: it never
    /// unwinds into the code that called `cancel()`.
    #[must_use]
    pub fn with_hook(
        token: &CancellationToken,
        on_cancel: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        Self::build(token, Some(Box::new(on_cancel)))
    }

    fn build(token: &CancellationToken, on_cancel: Option<Box<dyn Fn() + Send + Sync>>) -> Self {
        let signal = Arc::new(Signal {
            cancelled: AtomicBool::new(false),
            waiter: AtomicWaker::new(),
            on_cancel,
        });
        let mut watch = Box::pin(token.clone().cancelled_owned());
        let waker = Waker::from(Arc::clone(&signal));
        if watch
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready()
        {
            signal.wake_by_ref();
        }
        TokenWatch {
            signal,
            _watch: watch,
        }
    }

    /// `true` once the token is cancelled (or [`set`](Self::set) was called).
    #[must_use]
    #[inline]
    pub fn is_cancelled(&self) -> bool {
        // Acquire pairs with the Release in `Signal::wake_by_ref`: whoever sees `true` sees
        // what was done before the cancellation.
        self.signal.cancelled.load(Ordering::Acquire)
    }

    /// Wakes `waker` on cancellation (replacing the one registered before). Check
    /// [`is_cancelled`](Self::is_cancelled) after registering, or a cancellation in between
    /// is missed.
    pub fn register(&self, waker: &Waker) {
        self.signal.waiter.register(waker);
    }

    /// Runs `future` until it completes (`Some(output)`) or the token is cancelled (`None`),
    /// like `CancellationToken::run_until_cancelled` but checking the token with one atomic
    /// load per poll instead of its lock. Cancellation wins when both are ready. Only one
    /// waker is registered at a time: use it from the one task that owns this watch.
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_supervise::TokenWatch;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let token = CancellationToken::new();
    /// let watch = TokenWatch::new(&token);
    /// assert_eq!(watch.run_until_cancelled(async { 7 }).await, Some(7));
    /// token.cancel();
    /// assert_eq!(watch.run_until_cancelled(std::future::pending::<u8>()).await, None);
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future drops `future`: as cancel safe as `future`.
    pub fn run_until_cancelled<F: Future>(&self, future: F) -> RunUntilCancelled<'_, F> {
        RunUntilCancelled {
            watch: self,
            future,
        }
    }

    /// Marks the watch cancelled now (and runs the hook once), without waiting for tokio-util
    /// to wake it: for an owner that cancels the token itself and must see the flag at once.
    pub fn set(&self) {
        self.signal.wake_by_ref();
    }
}

pin_project! {
    /// Future returned by [`TokenWatch::run_until_cancelled`].
    #[must_use = "futures do nothing unless polled"]
    pub struct RunUntilCancelled<'a, F> {
        watch: &'a TokenWatch,
        #[pin]
        future: F,
    }
}

impl<F: Future> Future for RunUntilCancelled<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if this.watch.is_cancelled() {
            return Poll::Ready(None);
        }
        match this.future.poll(cx) {
            Poll::Ready(output) => Poll::Ready(Some(output)),
            Poll::Pending => {
                this.watch.register(cx.waker());
                // A cancellation between the check and the registration woke nobody.
                if this.watch.is_cancelled() {
                    Poll::Ready(None)
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl<F> fmt::Debug for RunUntilCancelled<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunUntilCancelled")
            .field("cancelled", &self.watch.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let first = !self.cancelled.swap(true, Ordering::AcqRel);
        if let (true, Some(on_cancel)) = (first, &self.on_cancel) {
            // This runs inside the canceller's `cancel()`, while tokio-util wakes the token's
            // waiters: a panic unwinding from here would end that `cancel()` with other
            // waiters not woken. It is caught and logged instead.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(on_cancel));
            if let Err(payload) = ran {
                let panic = crate::PanicError::from_panic("token-watch-hook", payload);
                tracing::error!(panic = %panic.message(), "a TokenWatch cancel hook panicked: caught");
            }
        }
        self.waiter.wake();
    }
}

impl fmt::Debug for TokenWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenWatch")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}
