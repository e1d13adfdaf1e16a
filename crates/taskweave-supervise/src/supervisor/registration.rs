//! Registration: `Supervisor::spawn`, the slot each task holds, and the future it runs.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::runtime::Handle;

use super::{Entry, Shared, Supervisor};
use crate::{CatchPanic, PanicError, SpawnError, TaskHandle, TaskName, catch_panic};

impl Supervisor {
    /// Spawns `future` as a task named `name`, or hands it back if the supervisor is closed.
    ///
    /// The task's panic is captured as with [`spawn`](crate::spawn), and also counted in
    /// [`metrics`](Self::metrics) and named in a drain report.
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_supervise::Supervisor;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let supervisor = Supervisor::new(CancellationToken::new());
    /// let task = supervisor.spawn("sum", async { 1 + 2 }).unwrap();
    /// assert_eq!(task.await.unwrap(), 3);
    ///
    /// supervisor.close();
    /// let refused = supervisor.spawn("late", async { 4 }).unwrap_err();
    /// assert!(matches!(refused, taskweave_supervise::SpawnError::Closed(_)));
    /// assert_eq!(refused.into_inner().await, 4);
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`SpawnError::Closed`] with the future when [`close`](Self::close) (or `shutdown`) has run.
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime, like `tokio::spawn`.
    #[track_caller]
    pub fn spawn<F>(
        &self,
        name: impl Into<TaskName>,
        future: F,
    ) -> Result<TaskHandle<F::Output>, SpawnError<F>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let name = name.into();
        let runtime = current_runtime();
        match self.register(&name) {
            Some(registration) => Ok(self.launch(&runtime, name, registration, future, |_| false)),
            None => Err(SpawnError::Closed(future)),
        }
    }

    /// Claims a slot for a task named `name`, or counts a refusal when closed.
    pub(crate) fn register(&self, name: &TaskName) -> Option<Registration> {
        let mut state = self.state();
        if state.closed {
            state.refused += 1;
            drop(state);
            tracing::debug!(task = %name, "spawn refused: supervisor closed");
            return None;
        }
        let id = state.next_id;
        state.next_id += 1;
        let key = state.tasks.insert(Entry {
            id,
            name: name.clone(),
            abort: None,
        });
        state.spawned += 1;
        Some(Registration {
            shared: Arc::clone(&self.shared),
            key,
            id,
            outcome: Outcome::Aborted,
        })
    }

    /// Spawns `future` for a slot claimed by [`register`](Self::register); `failed` tells
    /// whether an output counts as a failure.
    pub(crate) fn launch<F>(
        &self,
        runtime: &Handle,
        name: TaskName,
        registration: Registration,
        future: F,
        failed: fn(&F::Output) -> bool,
    ) -> TaskHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (key, id) = (registration.key, registration.id);
        let supervised = Supervised {
            future: catch_panic(name.clone(), future),
            failed,
            registration,
        };
        // The lock is not held while spawning: a runtime that is shutting down drops the
        // future inline, and the registration's `Drop` takes the lock.
        let join = runtime.spawn(supervised);
        let abort = join.abort_handle();
        let mut guard = self.state();
        let state = &mut *guard;
        let (abort_now, maybe_drained) = match state.tasks.get_mut(key) {
            Some(entry) if entry.id == id => {
                entry.abort = Some(abort);
                // A drain deadline passed between `register` and here: the sweep missed this
                // task. And a task that already runs (multi-thread) may be waiting for a
                // drain that needs its own id, known only from now on.
                (state.aborting, state.may_be_drained())
            }
            // Already finished and removed (the slot may even hold a newer task).
            _ => (false, false),
        };
        drop(guard);
        if abort_now {
            join.abort();
        }
        if maybe_drained {
            self.shared.drained.notify_waiters();
        }
        TaskHandle::new(name, join)
    }
}

/// The current runtime, checked before a slot is claimed so that a misplaced call leaves no
/// trace in the counters.
#[track_caller]
pub(crate) fn current_runtime() -> Handle {
    match Handle::try_current() {
        Ok(runtime) => runtime,
        Err(error) => panic!("Supervisor::spawn called outside a tokio runtime: {error}"),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Outcome {
    Finished,
    Failed,
    Panicked,
    Aborted,
}

/// A task's slot in the supervisor; dropping it (when the task's future is dropped, on every
/// path) removes the slot and records how the task ended.
pub(crate) struct Registration {
    shared: Arc<Shared>,
    key: usize,
    id: u64,
    outcome: Outcome,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        *match self.outcome {
            Outcome::Finished => &mut state.completed,
            Outcome::Failed => &mut state.failed,
            Outcome::Panicked => &mut state.panicked,
            Outcome::Aborted => &mut state.aborted,
        } += 1;
        let removed = match state.tasks.get(self.key) {
            Some(entry) if entry.id == self.id => Some(state.tasks.remove(self.key)),
            _ => None,
        };
        if let Some(entry) = removed {
            for (_, log) in &mut state.drains {
                let names = match self.outcome {
                    Outcome::Finished => &mut log.finished,
                    Outcome::Failed => &mut log.failed,
                    Outcome::Panicked => &mut log.panicked,
                    Outcome::Aborted => &mut log.aborted,
                };
                names.push(entry.name.clone());
            }
        }
        // The outcome is recorded before any drain waiter can wake. With one task left, a
        // waiter that is that very task is drained; it checks for itself.
        let maybe_drained = state.may_be_drained();
        drop(guard);
        if maybe_drained {
            self.shared.drained.notify_waiters();
        }
    }
}

pin_project! {
    /// The future a supervised task runs: the caught future plus its registration.
    ///
    /// Fields drop in declaration order: the user's future is dropped before the registration
    /// reports the task gone, so a drain never returns while an aborted task's destructors
    /// have yet to run.
    struct Supervised<F, T> {
        #[pin]
        future: CatchPanic<F>,
        failed: fn(&T) -> bool,
        registration: Registration,
    }
}

impl<F: Future<Output = T>, T> Future for Supervised<F, T> {
    type Output = Result<T, PanicError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let output = ready!(this.future.poll(cx));
        this.registration.outcome = match &output {
            Ok(value) if (this.failed)(value) => Outcome::Failed,
            Ok(_) => Outcome::Finished,
            Err(_) => Outcome::Panicked,
        };
        Poll::Ready(output)
    }
}
