//! Registration: `Supervisor::spawn`, the slot each task holds, and the future it runs.

use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::runtime::{Handle, RuntimeFlavor};

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
        let retired = (state.retired.len() >= RETIRED_SWEEP)
            .then(|| mem::replace(&mut state.retired, Vec::with_capacity(RETIRED_MAX)));
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
        drop(state);
        let registration = Registration {
            shared: Arc::clone(&self.shared),
            key,
            id,
            outcome: Outcome::Aborted,
            retire: false,
        };
        // Outside the lock, and once the registration exists: dropping a handle can free a
        // task, and nothing here may leave a claimed slot without its registration.
        drop(retired);
        Some(registration)
    }

    /// Spawns `future` for a slot claimed by [`register`](Self::register); `failed` tells
    /// whether an output counts as a failure.
    pub(crate) fn launch<F>(
        &self,
        runtime: &Handle,
        name: TaskName,
        mut registration: Registration,
        future: F,
        failed: fn(&F::Output) -> bool,
    ) -> TaskHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (key, id) = (registration.key, registration.id);
        registration.retire = runtime.runtime_flavor() == RuntimeFlavor::MultiThread
            && mem::size_of::<F>().max(mem::size_of::<F::Output>()) <= RETIRE_SIZE_MAX;
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
                // task (unless the task is that drain's caller). And a task that already runs
                // (multi-thread) may be waiting for a drain that needs its own id, known only
                // from now on.
                (state.aborts_at_launch(join.id()), state.may_be_drained())
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
    /// Whether the slot's abort handle goes to `State::retired` when the task ends (see
    /// `RETIRED_MAX`).
    retire: bool,
}

/// On the multi-thread runtime, the abort handles of up to this many ended tasks are kept in
/// `State::retired` and dropped in a batch, outside the lock, by a `register` (once
/// `RETIRED_SWEEP` are pending) or when a drain completes, instead of being dropped on the
/// worker that ran each task.
///
/// Kept past the task's end, the handle becomes the task's last reference, so whoever drops
/// it frees the task's memory (tokio's task cell). Freed by the worker, as happens without it
/// (the harness's own last reference), a cell the spawning thread allocated makes the worker
/// contend with that thread for the allocator's lock on it (glibc's arena lock: `perf` put
/// about a fifth of the multi-thread `spawn_and_join` row there, `docs/benchmarks.md`,
/// supervise section); freed by the spawning thread, it does not. The price is memory: up to
/// this many ended tasks' cells (their futures and outputs already dropped, each about
/// `RETIRE_SIZE_MAX` plus a few hundred bytes at most), and while a cell is kept it keeps the
/// runtime's handle alive. Correctness does not depend on which thread frees what, nor on a
/// dropped handle running no user code: `register` drops them once its registration exists.
pub(super) const RETIRED_MAX: usize = 32;
/// How many retired handles `register` lets pile up before it drops them.
pub(super) const RETIRED_SWEEP: usize = 16;
/// The largest future or output whose task is retired rather than freed at once.
pub(super) const RETIRE_SIZE_MAX: usize = 1024;

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
        let mut abort = None;
        if let Some(mut entry) = removed {
            abort = entry.abort.take();
            if self.retire
                && state.retired.len() < RETIRED_MAX
                && let Some(handle) = abort.take()
            {
                state.retired.push(handle);
            }
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
        drop(abort);
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
