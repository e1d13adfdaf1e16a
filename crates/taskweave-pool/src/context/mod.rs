//! `JobContext`: what a handler gets with each job, and the cheap cancellation flag behind it.

use std::fmt;
use std::sync::Arc;

use taskweave_supervise::TokenWatch;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

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

/// The pool's or batch's token and its [`TokenWatch`], so that the per-job check is one
/// atomic load instead of the token's lock.
pub(crate) struct CancelState {
    token: CancellationToken,
    watch: TokenWatch,
}

impl CancelState {
    pub(crate) fn new(token: CancellationToken) -> Arc<Self> {
        let watch = TokenWatch::new(&token);
        Arc::new(CancelState { token, watch })
    }

    /// Like `new`, and runs `on_cancel` once when the token is cancelled (synchronously,
    /// inside `cancel()`; or at once if it already is).
    pub(crate) fn with_hook(
        token: CancellationToken,
        on_cancel: impl Fn() + Send + Sync + 'static,
    ) -> Arc<Self> {
        let watch = TokenWatch::with_hook(&token, on_cancel);
        Arc::new(CancelState { token, watch })
    }

    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.watch.is_cancelled()
    }

    /// Cancels the token; the flag is set (and the hook has run) before this returns.
    pub(crate) fn cancel(&self) {
        self.token.cancel();
        // tokio-util wakes our waker inside `cancel()`, but when another thread cancelled a
        // parent at the same moment, its wake-up may still be on the way: set it here too.
        self.watch.set();
    }
}

#[cfg(test)]
mod tests;
