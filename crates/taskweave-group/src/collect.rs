//! `CollectGroup`: run every task to the end and report every failure with its label.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;

use taskweave_supervise::{PanicError, catch_panic};
use tokio::task::{Id, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::error::from_caught;
use crate::slots::{Slot, Slots};
use crate::{SpawnError, TaskFailure};

/// A group of independent tasks: a failure does not cancel the others, and
/// [`wait`](Self::wait) reports every failure with the label its task was spawned with.
///
/// For "notify every user, then tell me who could not be notified": each task is labelled
/// (a user id, a file name), runs to its end, and the report lists the failures in spawn
/// order. A panicking task is caught and reported like a failure. An optional limit bounds
/// how many run at once. The group's token (a child of the one it was created from) lets the
/// caller stop everything from outside; dropping the group cancels it and aborts the tasks.
///
/// # Examples
///
/// ```
/// use taskweave_group::CollectGroup;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let mut group = CollectGroup::new(CancellationToken::new()).with_limit(2);
/// for user in [1, 2, 3, 4] {
///     group
///         .spawn(user, async move {
///             if user % 2 == 0 { Err(format!("user {user}: mailbox full")) } else { Ok(()) }
///         })
///         .await
///         .unwrap();
/// }
/// let report = group.wait().await;
/// assert_eq!(report.succeeded, 2);
/// let failed: Vec<u32> = report.failures.iter().map(|(user, _)| *user).collect();
/// assert_eq!(failed, [2, 4]);
/// # }
/// ```
pub struct CollectGroup<L, E> {
    token: CancellationToken,
    tasks: JoinSet<Result<(), TaskFailure<E>>>,
    slots: Slots,
    next: usize,
    /// Each task's spawn order and label, by task id. Kept here rather than moved into the
    /// task, so that even a task whose future panics in its destructor is reported by label.
    labels: HashMap<Id, (usize, L)>,
}

/// What [`CollectGroup::wait`] found.
#[non_exhaustive]
pub struct CollectReport<L, E> {
    /// Tasks that returned `Ok`.
    pub succeeded: usize,
    /// Every failed or panicked task, `(label, failure)`, in spawn order.
    pub failures: Vec<(L, TaskFailure<E>)>,
}

impl<L, E> CollectReport<L, E> {
    /// `true` when no task failed.
    #[must_use]
    pub fn is_success(&self) -> bool {
        self.failures.is_empty()
    }
}

impl<L: fmt::Debug, E: fmt::Debug> fmt::Debug for CollectReport<L, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CollectReport")
            .field("succeeded", &self.succeeded)
            .field("failures", &self.failures)
            .finish()
    }
}

impl<L: Send + 'static, E: Send + 'static> CollectGroup<L, E> {
    /// An empty group whose token is a child of `token`.
    #[must_use]
    pub fn new(token: CancellationToken) -> Self {
        CollectGroup {
            token: token.child_token(),
            tasks: JoinSet::new(),
            slots: Slots::default(),
            next: 0,
            labels: HashMap::new(),
        }
    }

    /// At most `limit` tasks run at once.
    ///
    /// # Panics
    ///
    /// Panics if `limit` is zero, if a task was already spawned, or if `limit` exceeds tokio's maximum number of
    /// semaphore permits (`usize::MAX >> 3`).
    #[must_use]
    pub fn with_limit(mut self, limit: usize) -> Self {
        assert!(
            limit > 0,
            "CollectGroup::with_limit: limit must be greater than zero"
        );
        assert!(
            self.tasks.is_empty() && self.next == 0,
            "CollectGroup::with_limit: set the limit before the first spawn"
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

    /// Spawns `future` labelled `label`, waiting for a free slot when a limit is set.
    ///
    /// # Errors
    ///
    /// The future is handed back: [`SpawnError::Cancelled`] when the group's token is
    /// cancelled.
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call spawned nothing.
    pub async fn spawn<F>(&mut self, label: L, future: F) -> Result<(), SpawnError<F>>
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        let (future, slot) = self.slots.claim(&self.token, future).await?;
        self.start(label, future, slot);
        Ok(())
    }

    /// Spawns `future` labelled `label` only if a slot is free now.
    ///
    /// # Errors
    ///
    /// The future is handed back: [`SpawnError::Full`] or [`SpawnError::Cancelled`].
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    pub fn try_spawn<F>(&mut self, label: L, future: F) -> Result<(), SpawnError<F>>
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        let (future, slot) = self.slots.try_claim(&self.token, future)?;
        self.start(label, future, slot);
        Ok(())
    }

    fn start<F>(&mut self, label: L, future: F, permit: Slot)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        let order = self.next;
        self.next += 1;
        let handle = self.tasks.spawn(async move {
            let outcome = catch_panic("collect-task", future).await;
            drop(permit);
            from_caught(outcome)
        });
        self.labels.insert(handle.id(), (order, label));
    }

    /// Waits for every task and reports the successes and every failure, in spawn order.
    ///
    /// Every spawned task is counted once: a task whose future panicked in its destructor is
    /// reported as [`TaskFailure::Panicked`] too.
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future drops the group: its token is cancelled and its tasks
    /// aborted.
    pub async fn wait(mut self) -> CollectReport<L, E> {
        let mut succeeded = 0;
        let mut failures = Vec::new();
        while let Some(joined) = self.tasks.join_next_with_id().await {
            let (id, outcome) = match joined {
                Ok((id, outcome)) => (id, outcome),
                Err(error) => {
                    let id = error.id();
                    let panic = if error.is_panic() {
                        PanicError::from_panic("collect-task", error.into_panic())
                    } else {
                        PanicError::from_payload("collect-task", &"the task was aborted")
                    };
                    (id, Err(TaskFailure::Panicked(panic)))
                }
            };
            let Some((order, label)) = self.labels.remove(&id) else {
                continue;
            };
            match outcome {
                Ok(()) => succeeded += 1,
                Err(failure) => failures.push((order, label, failure)),
            }
        }
        self.token.cancel();
        failures.sort_unstable_by_key(|(order, _, _)| *order);
        CollectReport {
            succeeded,
            failures: failures
                .into_iter()
                .map(|(_, label, failure)| (label, failure))
                .collect(),
        }
    }
}

impl<L, E> Drop for CollectGroup<L, E> {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

impl<L, E> fmt::Debug for CollectGroup<L, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CollectGroup")
            .field("tasks", &self.tasks.len())
            .field("limit", &self.slots.limit())
            .field("cancelled", &self.token.is_cancelled())
            .finish()
    }
}
