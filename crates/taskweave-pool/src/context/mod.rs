//! `JobContext`: what a handler gets with each job, and the cheap cancellation flag behind it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Wake, Waker};

use tokio_util::sync::{
    CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned,
};

/// What a pool or batch handler receives with each job: the job's index and the token that is
/// cancelled when the run or pool stops its handlers.
///
/// Cloning it is one reference-count increment. It exists because handing every job its own
/// `CancellationToken` clone costs two lock round trips per job inside tokio-util, which was
/// the largest single cost of a pool job (see `docs/benchmarks.md`); call
/// [`token`](Self::token)`().clone()` when a callee needs an owned token.
///
/// # Examples
///
/// ```
/// use taskweave_pool::{JobContext, run};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let report = run(CancellationToken::new(), 2, ["a", "b"], |context: JobContext, name| async move {
///     assert!(!context.is_cancelled());
///     Ok::<_, String>(format!("{name}#{}", context.index()))
/// })
/// .await;
/// assert_eq!(report.results[1].1.as_ref().unwrap(), "b#1");
/// # }
/// ```
#[derive(Clone)]
pub struct JobContext {
    index: u64,
    cancel: Arc<CancelState>,
}

impl JobContext {
    pub(crate) fn new(index: u64, cancel: Arc<CancelState>) -> Self {
        JobContext { index, cancel }
    }

    /// The job's index: its position in the batch, or its acceptance order in the pool.
    #[must_use]
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The token that is cancelled when the handlers must stop.
    #[must_use]
    pub fn token(&self) -> &CancellationToken {
        &self.cancel.token
    }

    /// `true` once the handlers must stop. A single atomic load, cheap enough for a hot loop.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Completes when the handlers must stop; `token().cancelled()`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.token.cancelled()
    }
}

impl fmt::Debug for JobContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobContext")
            .field("index", &self.index)
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

/// A token plus a flag that mirrors its cancellation, readable with one atomic load.
///
/// `CancellationToken::is_cancelled` takes a lock. The flag is set by a waker registered on
/// the token once, which tokio-util wakes from inside `cancel()` (of the token or an
/// ancestor). `CancelState::cancel` also sets it itself, so that after the pool cancels its
/// own token the flag is `true` without depending on that detail. For a cancellation that
/// comes from an ancestor, the flag follows as soon as that waker runs.
pub(crate) struct CancelState {
    token: CancellationToken,
    flag: Arc<Flag>,
    // Keeps the waker registered on the token for as long as the flag is in use.
    _watch: Pin<Box<WaitForCancellationFutureOwned>>,
}

/// Runs inside `cancel()`, on the cancelling thread, right after the flag is set.
pub(crate) type OnCancel = Box<dyn Fn() + Send + Sync>;

struct Flag {
    cancelled: AtomicBool,
    on_cancel: Option<OnCancel>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Release pairs with the Acquire in `is_cancelled`: a reader that sees `true` also
        // sees everything the canceller did before `cancel()`.
        let first = !self.cancelled.swap(true, Ordering::AcqRel);
        if let (true, Some(on_cancel)) = (first, &self.on_cancel) {
            on_cancel();
        }
    }
}

impl CancelState {
    pub(crate) fn new(token: CancellationToken) -> Arc<Self> {
        Self::with_hook(token, None)
    }

    /// Like `new`, and runs `on_cancel` once when the token is cancelled (synchronously,
    /// inside `cancel()`; or at once if it already is).
    pub(crate) fn with_hook(token: CancellationToken, on_cancel: Option<OnCancel>) -> Arc<Self> {
        let flag = Arc::new(Flag {
            cancelled: AtomicBool::new(false),
            on_cancel,
        });
        let mut watch = Box::pin(token.clone().cancelled_owned());
        let waker = Waker::from(Arc::clone(&flag));
        if watch
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready()
        {
            flag.wake_by_ref();
        }
        Arc::new(CancelState {
            token,
            flag,
            _watch: watch,
        })
    }

    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.flag.cancelled.load(Ordering::Acquire)
    }

    /// Cancels the token; the flag is set (and the hook has run) before this returns.
    pub(crate) fn cancel(&self) {
        self.token.cancel();
        // tokio-util wakes our waker inside `cancel()`, but when another thread cancelled a
        // parent at the same moment, its wake-up may still be on the way: set it here too.
        self.flag.wake_by_ref();
    }
}

#[cfg(test)]
mod tests;
