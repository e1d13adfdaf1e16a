//! `TaskGroup`: errgroup semantics: the first error cancels the rest and is what `wait` returns.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use taskweave_supervise::{PanicError, catch_panic};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::slots::{Slot, Slots};
use crate::{SpawnError, TaskFailure};

/// A group of tasks where the first failure cancels the others, like Go's `errgroup`.
///
/// - The group's [`token`](Self::token) is a child of the token it was created from: give it
///   to the tasks (the seed's classic mistake is to keep using the parent's). It is cancelled
///   by the first failure, by the parent, and when [`wait`](Self::wait) returns.
/// - [`wait`](Self::wait) returns the **first failure by time**. The failure is recorded before
///   the group's token is cancelled, so a sibling's "cancelled" error, which can only come
///   after, never takes its place. Later failures are logged at debug and dropped.
/// - A panicking task is caught (logged with its backtrace), frees its slot, and becomes
///   [`TaskFailure::Panicked`]. `wait` never panics, unlike `JoinSet::join_all`, which
///   re-raises a task's panic in the caller.
/// - With a limit, [`spawn`](Self::spawn) waits for a free slot and
///   [`try_spawn`](Self::try_spawn) hands the future back when the group is full.
/// - Dropping the group without waiting cancels its token and aborts its tasks.
///
/// # Comparison to `JoinSet`
///
/// `JoinSet` is the building block this type uses. Use `JoinSet` directly when every task's
/// output matters and there is no "first error wins" policy; use `TaskGroup` for fan-out where
/// one failure makes the rest pointless (assembling a page from several sources), and
/// [`CollectGroup`](crate::CollectGroup) when every failure must be reported.
///
/// # Examples
///
/// ```
/// use taskweave_group::{TaskFailure, TaskGroup};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let mut group = TaskGroup::new(CancellationToken::new());
/// let token = group.token();
/// group.spawn(async { Ok(()) }).await.unwrap();
/// group.spawn(async { Err("profile service: 503") }).await.unwrap();
/// group
///     .spawn(async move {
///         token.cancelled().await; // a slow source, stopped by the failure above
///         Err("cancelled")
///     })
///     .await
///     .unwrap();
/// let failure = group.wait().await.unwrap_err();
/// assert!(matches!(failure, TaskFailure::Failed("profile service: 503")));
/// # }
/// ```
pub struct TaskGroup<E> {
    token: CancellationToken,
    tasks: JoinSet<()>,
    slots: Slots,
    shared: Arc<Shared<E>>,
}

/// What every task of the group holds: one `Arc` clone per task, rather than a token clone,
/// which takes the token's lock on clone and on drop (all clones share that lock, so on a
/// multi-thread runtime it was the dominant cost of a spawn).
struct Shared<E> {
    token: CancellationToken,
    first: Mutex<Option<TaskFailure<E>>>,
}

impl<E: Send + 'static> TaskGroup<E> {
    /// An empty group whose token is a child of `token`.
    #[must_use]
    pub fn new(token: CancellationToken) -> Self {
        let token = token.child_token();
        TaskGroup {
            token: token.clone(),
            tasks: JoinSet::new(),
            slots: Slots::default(),
            shared: Arc::new(Shared {
                token,
                first: Mutex::new(None),
            }),
        }
    }

    /// At most `limit` tasks run at once. A limit of zero refuses every spawn with
    /// [`SpawnError::Full`] (it can never have a free slot).
    ///
    /// # Panics
    ///
    /// Panics if a task was already spawned (the limit is set before the first spawn), or if
    /// `limit` exceeds tokio's maximum number of semaphore permits (`usize::MAX >> 3`).
    #[must_use]
    pub fn with_limit(mut self, limit: usize) -> Self {
        assert!(
            self.tasks.is_empty(),
            "TaskGroup::with_limit: set the limit before the first spawn"
        );
        self.slots = Slots::limited(limit);
        self
    }

    /// The group's token, to hand to its tasks.
    #[must_use]
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// The limit, if one is set.
    #[must_use]
    pub fn limit(&self) -> Option<usize> {
        self.slots.limit()
    }

    /// Tasks spawned and not yet collected by `wait`.
    #[must_use]
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// `true` when no task is pending.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Spawns `future`, first waiting for a free slot when a limit is set.
    ///
    /// # Errors
    ///
    /// The future is handed back: [`SpawnError::Cancelled`] when the group's token is
    /// cancelled (before or while waiting), [`SpawnError::Full`] when the limit is zero.
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the returned future is dropped while waiting for a slot, nothing was
    /// spawned (the task's future is dropped with it).
    pub async fn spawn<F>(&mut self, future: F) -> Result<(), SpawnError<F>>
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        let (future, slot) = self.slots.claim(&self.token, future).await?;
        self.start(future, slot);
        Ok(())
    }

    /// Spawns `future` only if a slot is free now.
    ///
    /// # Errors
    ///
    /// The future is handed back: [`SpawnError::Full`] when every slot is taken (or the
    /// limit is zero), [`SpawnError::Cancelled`] when the group's token is cancelled.
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    pub fn try_spawn<F>(&mut self, future: F) -> Result<(), SpawnError<F>>
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        let (future, slot) = self.slots.try_claim(&self.token, future)?;
        self.start(future, slot);
        Ok(())
    }

    fn start<F>(&mut self, future: F, permit: Slot)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        let shared = Arc::clone(&self.shared);
        self.tasks.spawn(async move {
            let outcome = catch_panic("group-task", future).await;
            let failure = match outcome {
                Ok(Ok(())) => return,
                Ok(Err(error)) => TaskFailure::Failed(error),
                Err(panic) => TaskFailure::Panicked(panic),
            };
            let later = record_first(&shared.first, failure);
            // Only after the failure is recorded: a sibling that fails because of this
            // cancellation always comes second.
            shared.token.cancel();
            // And the slot is freed only after that (it is dropped with the task's future):
            // a spawn waiting for it then sees the group cancelled, like Go's errgroup.
            drop(permit);
            // A later failure is dropped last: its `Drop` is user code, and if it panics, the
            // books are already kept (`wait` sees a panicked task and goes on).
            drop(later);
        });
    }

    /// Waits for every task, cancels the group's token, and returns the first failure.
    ///
    /// Never panics because of a task: panics were caught in the tasks.
    ///
    /// # Errors
    ///
    /// The first failure by time, as a [`TaskFailure`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future drops the group: its token is cancelled and its tasks
    /// aborted.
    pub async fn wait(mut self) -> Result<(), TaskFailure<E>> {
        while let Some(joined) = self.tasks.join_next().await {
            // A task cannot panic out of its `catch_panic`, and nobody else aborts it; a
            // panicking destructor of its future is the one way to get here.
            if let Err(error) = joined
                && error.is_panic()
            {
                let panic = PanicError::from_panic("group-task", error.into_panic());
                drop(record_first(
                    &self.shared.first,
                    TaskFailure::Panicked(panic),
                ));
                // As for a failure inside the task: the siblings are told to stop.
                self.shared.token.cancel();
            }
        }
        self.token.cancel();
        match lock(&self.shared.first).take() {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }
}

/// Keeps `failure` if it is the first; otherwise hands it back, for the caller to drop
/// outside the lock and after its own bookkeeping.
fn record_first<E>(
    first: &Mutex<Option<TaskFailure<E>>>,
    failure: TaskFailure<E>,
) -> Option<TaskFailure<E>> {
    let mut slot = lock(first);
    if slot.is_none() {
        *slot = Some(failure);
        None
    } else {
        tracing::debug!("task group: a later failure is dropped; the first one wins");
        Some(failure)
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // No user code runs under these locks; a poisoned one still holds consistent data.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<E> Drop for TaskGroup<E> {
    fn drop(&mut self) {
        // The `JoinSet` aborts the tasks; the token tells the ones that are mid-poll elsewhere.
        self.token.cancel();
    }
}

impl<E> fmt::Debug for TaskGroup<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskGroup")
            .field("tasks", &self.tasks.len())
            .field("limit", &self.slots.limit())
            .field("cancelled", &self.token.is_cancelled())
            .finish()
    }
}
