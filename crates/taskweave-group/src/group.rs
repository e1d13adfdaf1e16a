//! `TaskGroup`: errgroup semantics: the first error cancels the rest and is what `wait` returns.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;

use taskweave_supervise::{PanicError, catch_panic};
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::error::from_caught;
use crate::slots::{Slot, Slots};
use crate::{SpawnError, Spawner, TaskFailure};
use taskweave_supervise::internal::lock;

/// A group of tasks where the first failure cancels the others, like Go's `errgroup`.
///
/// - The group's [`token`](Self::token) is a child of the token it was created from: give it
///   to the tasks (the seed's classic mistake is to keep using the parent's). It is cancelled
///   by the first failure, by the parent, and when [`wait`](Self::wait) returns.
/// - [`wait`](Self::wait) returns the **first failure by time**. The failure is recorded before
///   the group's token is cancelled, so a sibling's "cancelled" error, which can only come
///   after, never takes its place. [`wait_all`](Self::wait_all) returns every failure, the
///   first one first (conc's `WithCancelOnError` mode).
/// - A panicking task is caught (logged with its backtrace), frees its slot, and becomes
///   [`TaskFailure::Panicked`]. `wait` never panics, unlike `JoinSet::join_all`, which
///   re-raises a task's panic in the caller.
/// - With a limit, [`spawn`](Self::spawn) waits for a free slot and
///   [`try_spawn`](Self::try_spawn) hands the future back when the group is full.
/// - Tasks can spawn siblings: [`spawner`](Self::spawner) gives a cheap, cloneable
///   [`Spawner`] to move into a task (as Go's `errgroup.Go` may be called from inside a
///   task). `wait` waits for the siblings too.
/// - Finished tasks are reaped as the group goes on (at every spawn and every
///   [`len`](Self::len)), so a long-lived group holds the tasks that are running, not every
///   task it ever ran.
/// - Dropping the group without waiting cancels its token and aborts its tasks.
///
/// # The error type
///
/// `E` is the error every task returns. When a task uses `?`, Rust cannot infer `E` from the
/// task alone (`?` converts with `From`), so name it once on the group:
///
/// ```
/// use taskweave_group::TaskGroup;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let group = TaskGroup::<std::num::ParseIntError>::new(CancellationToken::new());
/// group
///     .spawn(async {
///         let port: u16 = "8080".parse()?;
///         assert_eq!(port, 8080);
///         Ok(())
///     })
///     .await
///     .unwrap();
/// group.wait().await.unwrap();
/// # }
/// ```
///
/// # Comparison to `JoinSet`
///
/// `JoinSet` is the building block this type uses. Use `JoinSet` directly when every task's
/// output matters and there is no "first error wins" policy; use `TaskGroup` for fan-out where
/// one failure makes the rest pointless (assembling a page from several sources), and
/// [`CollectGroup`](crate::CollectGroup) when every failure must be reported without
/// cancelling the others.
///
/// # Examples
///
/// ```
/// use taskweave_group::{TaskFailure, TaskGroup};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let group = TaskGroup::new(CancellationToken::new());
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
    inner: Arc<Inner<E>>,
}

/// What the group, its spawners and every task share: one `Arc` clone per task, rather than a
/// token clone, which takes the token's lock on clone and on drop (all clones share that lock,
/// so on a multi-thread runtime it was the dominant cost of a spawn).
pub(crate) struct Inner<E> {
    pub(crate) token: CancellationToken,
    /// Behind a lock so that spawners (on other tasks) can spawn. It is never held across an
    /// await, and no user code runs under it: the token is cancelled after it is released (a
    /// cancellation runs `TokenWatch` hooks, which may be anyone's), and a task that tokio
    /// drops inside `spawn` (a runtime shutting down) leaves its future to be dropped after it.
    tasks: Mutex<Tasks>,
    slots: Slots,
    /// Every failure in the order recorded; the first is what `wait` returns.
    failures: Mutex<Vec<TaskFailure<E>>>,
    /// Set when the group is dropped: later failures have nobody to go to and are dropped at
    /// once (inside a catch), not kept until the last spawner goes.
    dropped: AtomicBool,
}

struct Tasks {
    set: JoinSet<()>,
    /// Set when `wait` has seen the set empty, or the group was dropped: no task joins after.
    closed: bool,
    /// Set by the first spawn: the limit can no longer change.
    spawned: bool,
}

thread_local! {
    /// `true` on this thread while `start` holds the `tasks` lock around `JoinSet::spawn`.
    static SPAWNING: Cell<bool> = const { Cell::new(false) };
    /// User futures whose task tokio dropped inside that `spawn`: dropped by `start` once the
    /// lock is released. Almost always empty.
    static BURIED: RefCell<Vec<Box<dyn Send>>> = const { RefCell::new(Vec::new()) };
}

/// Holds a task's user future until the task's first poll. If tokio drops the task before
/// (inside `spawn`, when the runtime is shutting down), the future's `Drop` (user code) would
/// run under the `tasks` lock; it is moved to `BURIED` instead, and dropped after the lock.
struct Unstarted<F: Send + 'static> {
    future: Option<F>,
}

impl<F: Send + 'static> Drop for Unstarted<F> {
    fn drop(&mut self) {
        if let Some(future) = self.future.take() {
            if SPAWNING.with(Cell::get) {
                BURIED.with(|buried| buried.borrow_mut().push(Box::new(future)));
            } else {
                drop(future);
            }
        }
    }
}

impl<E: Send + 'static> TaskGroup<E> {
    /// An empty group whose token is a child of `token`.
    #[must_use]
    pub fn new(token: CancellationToken) -> Self {
        TaskGroup {
            inner: Arc::new(Inner {
                token: token.child_token(),
                tasks: Mutex::new(Tasks {
                    set: JoinSet::new(),
                    closed: false,
                    spawned: false,
                }),
                dropped: AtomicBool::new(false),
                slots: Slots::default(),
                failures: Mutex::new(Vec::new()),
            }),
        }
    }

    /// At most `limit` tasks run at once.
    ///
    /// # Panics
    ///
    /// Panics if `limit` is zero (a group that can never run a task is a configuration
    /// mistake; see the workspace's rule on zero limits), if a task was already spawned or a
    /// [`Spawner`] taken (the limit is set first), or if `limit` exceeds tokio's maximum number
    /// of semaphore permits (`usize::MAX >> 3`).
    #[must_use]
    pub fn with_limit(mut self, limit: usize) -> Self {
        assert!(
            limit > 0,
            "TaskGroup::with_limit: limit must be greater than zero"
        );
        let inner = Arc::get_mut(&mut self.inner)
            .filter(|inner| !lock(&inner.tasks).spawned)
            .expect("TaskGroup::with_limit: set the limit before the first spawn");
        inner.slots = Slots::limited(limit);
        self
    }

    /// The group's token, to hand to its tasks.
    #[must_use]
    pub fn token(&self) -> CancellationToken {
        self.inner.token.clone()
    }

    /// A cloneable handle that spawns into this group, for its tasks to spawn siblings.
    #[must_use]
    pub fn spawner(&self) -> Spawner<E> {
        Spawner::new(Arc::clone(&self.inner))
    }

    /// The limit, if one is set.
    #[must_use]
    pub fn limit(&self) -> Option<usize> {
        self.inner.slots.limit()
    }

    /// Tasks spawned and not yet finished (finished ones are reaped first).
    #[must_use]
    pub fn len(&self) -> usize {
        let mut tasks = lock(&self.inner.tasks);
        let failed = self.inner.reap(&mut tasks);
        let len = tasks.set.len();
        drop(tasks);
        self.inner.cancel_if(failed);
        len
    }

    /// `true` when no task is running.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Spawns `future`, first waiting for a free slot when a limit is set.
    ///
    /// # Errors
    ///
    /// The future is handed back: [`SpawnError::Cancelled`] when the group's token is
    /// cancelled (before or while waiting).
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the returned future is dropped while waiting for a slot, nothing was
    /// spawned (the task's future is dropped with it).
    pub async fn spawn<F>(&self, future: F) -> Result<(), SpawnError<F>>
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        self.inner.spawn(future).await
    }

    /// Spawns `future` only if a slot is free now.
    ///
    /// # Errors
    ///
    /// The future is handed back: [`SpawnError::Full`] when every slot is taken,
    /// [`SpawnError::Cancelled`] when the group's token is cancelled.
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    pub fn try_spawn<F>(&self, future: F) -> Result<(), SpawnError<F>>
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        self.inner.try_spawn(future)
    }

    /// Waits for every task (siblings spawned meanwhile included), cancels the group's token,
    /// and returns the first failure.
    ///
    /// Never panics because of a task: panics were caught in the tasks. The later failures
    /// are dropped here (a panic in one's `Drop` is caught and logged).
    ///
    /// # Errors
    ///
    /// The first failure by time, as a [`TaskFailure`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future drops the group: its token is cancelled and its tasks
    /// aborted.
    pub async fn wait(self) -> Result<(), TaskFailure<E>> {
        let mut failures = self.finish().await.into_iter();
        let first = failures.next();
        for later in failures {
            drop_quietly(later);
        }
        match first {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    /// Like [`wait`](Self::wait), but returns every failure: the first by time first, then the
    /// others in the order they happened (typically the siblings' answers to the
    /// cancellation). The first failure still cancels the rest, as with `wait`; this is conc's
    /// `WithCancelOnError` mode. For independent tasks that must all run, use
    /// [`CollectGroup`](crate::CollectGroup).
    ///
    /// # Errors
    ///
    /// Every failure, never an empty `Vec`.
    ///
    /// # Cancel safety
    ///
    /// As for [`wait`](Self::wait).
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_group::{TaskFailure, TaskGroup};
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let group = TaskGroup::new(CancellationToken::new());
    /// let token = group.token();
    /// group.spawn(async { Err("disk full".to_owned()) }).await.unwrap();
    /// group
    ///     .spawn(async move {
    ///         token.cancelled().await;
    ///         Err("upload: cancelled".to_owned())
    ///     })
    ///     .await
    ///     .unwrap();
    /// let failures = group.wait_all().await.unwrap_err();
    /// let messages: Vec<String> = failures.iter().map(ToString::to_string).collect();
    /// assert_eq!(messages, ["disk full", "upload: cancelled"]);
    /// # }
    /// ```
    pub async fn wait_all(self) -> Result<(), Vec<TaskFailure<E>>> {
        let failures = self.finish().await;
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures)
        }
    }

    /// Waits until no task is left, then cancels the token and takes the failures.
    async fn finish(&self) -> Vec<TaskFailure<E>> {
        let inner = &self.inner;
        std::future::poll_fn(|cx| {
            let mut tasks = lock(&inner.tasks);
            let mut failed = false;
            let polled = loop {
                match tasks.set.poll_join_next(cx) {
                    Poll::Ready(Some(joined)) => failed |= inner.joined(joined),
                    Poll::Ready(None) => {
                        // Under the lock: a spawn that takes it after this refuses, so no
                        // task starts after `wait` returned.
                        tasks.closed = true;
                        break Poll::Ready(());
                    }
                    Poll::Pending => break Poll::Pending,
                }
            };
            drop(tasks);
            inner.cancel_if(failed || polled.is_ready());
            polled
        })
        .await;
        std::mem::take(&mut *lock(&inner.failures))
    }
}

impl<E: Send + 'static> Inner<E> {
    pub(crate) async fn spawn<F>(self: &Arc<Self>, future: F) -> Result<(), SpawnError<F>>
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        let (future, slot) = self.slots.claim(&self.token, future).await?;
        self.start(future, slot)
    }

    pub(crate) fn try_spawn<F>(self: &Arc<Self>, future: F) -> Result<(), SpawnError<F>>
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        let (future, slot) = self.slots.try_claim(&self.token, future)?;
        self.start(future, slot)
    }

    fn start<F>(self: &Arc<Self>, future: F, permit: Slot) -> Result<(), SpawnError<F>>
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        // Declared first, so dropped last: after the lock, on every path (an unwind of
        // `spawn` outside a runtime included).
        let _buried = DropBuried;
        let mut tasks = lock(&self.tasks);
        // A failure found by the reaping counts before this spawn: the task is refused.
        let failed = self.reap(&mut tasks);
        // Checked under the lock that `finish` closes under: nothing joins a group that has
        // been waited for. (The token was checked by the slot's claim just before; reading it
        // again costs a lock of the token per spawn.)
        if failed || tasks.closed {
            drop(tasks);
            self.cancel_if(failed);
            return Err(SpawnError::Cancelled(future));
        }
        tasks.spawned = true;
        let inner = Arc::clone(self);
        let mut unstarted = Unstarted {
            future: Some(future),
        };
        SPAWNING.with(|flag| flag.set(true));
        let spawning = ResetOnDrop;
        tasks.set.spawn(async move {
            let future = unstarted
                .future
                .take()
                .expect("taken once, at the first poll");
            drop(unstarted);
            let Err(failure) = from_caught(catch_panic("group-task", future).await) else {
                return;
            };
            // The failure is recorded before the token is cancelled, so a sibling that fails
            // because of this cancellation always comes second.
            inner.record(failure);
            // And the slot is freed only after that (it is dropped with the task's future):
            // a spawn waiting for it then sees the group cancelled, like Go's errgroup.
            drop(permit);
        });
        drop(spawning);
        drop(tasks);
        Ok(())
    }

    /// Cancels the token when a failure was recorded under the `tasks` lock (see `tasks`).
    fn cancel_if(&self, failed: bool) {
        if failed {
            self.token.cancel();
        }
    }

    /// Collects the tasks that have finished, so that the set holds only running ones.
    /// Returns `true` if a failure was recorded: the caller cancels the token after it has
    /// released the lock.
    fn reap(&self, tasks: &mut Tasks) -> bool {
        let mut failed = false;
        while let Some(joined) = tasks.set.try_join_next() {
            failed |= self.joined(joined);
        }
        failed
    }

    /// What a finished task left: nothing, unless a panic escaped its poll (its failure is
    /// caught and recorded inside, but a `tracing` subscriber that panics while the caught
    /// panic is logged is outside the catch) or its future panicked in its destructor while
    /// tokio aborted it (a runtime shutting down; the group's drop takes the set away first).
    /// Returns `true` when it recorded a failure, for the caller to cancel the token once it
    /// has released the `tasks` lock.
    fn joined(&self, joined: Result<(), JoinError>) -> bool {
        if let Err(error) = joined
            && error.is_panic()
        {
            let panic = PanicError::from_panic("group-task", error.into_panic());
            self.push(TaskFailure::Panicked(panic));
            return true;
        }
        false
    }

    /// Records `failure`, then cancels the siblings.
    fn record(&self, failure: TaskFailure<E>) {
        self.push(failure);
        self.token.cancel();
    }

    fn push(&self, failure: TaskFailure<E>) {
        let mut failures = lock(&self.failures);
        // Read under the lock the group's `Drop` sets it under: a failure is either taken by
        // that `Drop` or dropped here, never left behind.
        if self.dropped.load(Ordering::Relaxed) {
            drop(failures);
            drop_quietly(failure);
            return;
        }
        if !failures.is_empty() {
            tracing::debug!("task group: a later failure; the first one wins");
        }
        failures.push(failure);
    }
}

/// Drops a failure the caller will not see (or a future whose task never started). Its `Drop`
/// is user code: a panic there is caught and logged, so that `wait` never panics because of a
/// task.
pub(crate) fn drop_quietly<T>(value: T) {
    if let Err(payload) = std::panic::catch_unwind(AssertUnwindSafe(move || drop(value))) {
        let panic = PanicError::from_panic("group-task", payload);
        tracing::error!(panic = %panic.message(), "task group: a Drop panicked; caught");
    }
}

/// Drops what `BURIED` holds, once the `tasks` lock is released.
struct DropBuried;

impl Drop for DropBuried {
    fn drop(&mut self) {
        let buried = BURIED.with(|buried| std::mem::take(&mut *buried.borrow_mut()));
        for future in buried {
            drop_quietly(future);
        }
    }
}

/// Clears `SPAWNING` however `spawn` returns.
struct ResetOnDrop;

impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        SPAWNING.with(|flag| flag.set(false));
    }
}

impl<E> Drop for TaskGroup<E> {
    fn drop(&mut self) {
        // Spawners refuse from now on; the tasks that are mid-poll elsewhere see the token,
        // and the rest are aborted now.
        let mut tasks = lock(&self.inner.tasks);
        tasks.closed = true;
        // Taken out, so that spawners that outlive the group do not keep the aborted tasks'
        // entries; dropping the set aborts them and detaches them.
        let set = std::mem::take(&mut tasks.set);
        drop(tasks);
        drop(set);
        self.inner.token.cancel();
        let mut guard = lock(&self.inner.failures);
        self.inner.dropped.store(true, Ordering::Relaxed);
        let failures = std::mem::take(&mut *guard);
        drop(guard);
        for failure in failures {
            drop_quietly(failure);
        }
    }
}

impl<E> fmt::Debug for TaskGroup<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskGroup")
            .field("tasks", &lock(&self.inner.tasks).set.len())
            .field("limit", &self.inner.slots.limit())
            .field("cancelled", &self.inner.token.is_cancelled())
            .finish()
    }
}
