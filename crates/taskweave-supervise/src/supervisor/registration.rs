//! Registration: `Supervisor::spawn`, the slot each task holds, and the future it runs.

use std::cell::{Cell, RefCell};
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
        self.launch(&runtime, name, future, |future| future, |_| false)
            .map_err(SpawnError::Closed)
    }

    /// Claims a slot for a task named `name` and spawns the future `build` makes of `input`,
    /// under one lock; or hands `input` back (and counts a refusal) when closed. `failed`
    /// tells whether an output counts as a failure.
    ///
    /// One lock round trip per spawn, not two: the slot is claimed, the task spawned and its
    /// abort handle stored while the lock is held, so a task that ends at once (on another
    /// worker) finds its slot complete. `build` only moves values (no user code runs under the
    /// lock). What could run user code there is tokio dropping the task inside `spawn` (a
    /// runtime shutting down): the task's future is then dropped after the lock is released
    /// (see `Deferred`).
    pub(crate) fn launch<G, F>(
        &self,
        runtime: &Handle,
        name: TaskName,
        input: G,
        build: impl FnOnce(G) -> F,
        failed: fn(&F::Output) -> bool,
    ) -> Result<TaskHandle<F::Output>, G>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        // Declared first, so dropped last: after the lock, on every path.
        let deferred = Deferred;
        let mut state = self.state();
        if state.closed {
            state.refused += 1;
            drop(state);
            tracing::debug!(task = %name, "spawn refused: supervisor closed");
            return Err(input);
        }
        let id = state.next_id;
        state.next_id += 1;
        let key = state.tasks.insert(Entry {
            id,
            name: name.clone(),
            abort: None,
        });
        state.spawned += 1;
        let supervised = Supervised {
            stage: Stage::Unstarted {
                future: Unstarted(Some(build(input))),
                name: name.clone(),
            },
            failed,
            registration: Registration {
                shared: Arc::clone(&self.shared),
                key,
                id,
                outcome: Outcome::Aborted,
            },
        };
        LAUNCHING.with(|flag| flag.set(true));
        let launching = Launching;
        let join = runtime.spawn(supervised);
        drop(launching);
        let abort = join.abort_handle();
        // Still this task's: its end (on any thread) takes this lock to remove the slot, and
        // an end inside `spawn` was deferred.
        if let Some(entry) = state.tasks.get_mut(key) {
            entry.abort = Some(abort.clone());
        }
        let aborting = state.aborting;
        drop(state);
        drop(deferred);
        // A drain deadline has passed: the sweep is over, this task is aborted at once.
        if aborting {
            abort.abort();
        }
        Ok(TaskHandle::new(name, join))
    }
}

thread_local! {
    /// `true` on this thread while `launch` holds the supervisor's lock around `spawn`.
    static LAUNCHING: Cell<bool> = const { Cell::new(false) };
    /// What tokio dropped inside that `spawn` (a task's future and its registration): dropped
    /// by `launch` once the lock is released, in that order. Almost always empty.
    static DEFERRED: RefCell<Vec<Box<dyn Send>>> = const { RefCell::new(Vec::new()) };
}

/// Clears `LAUNCHING` however `spawn` returns.
struct Launching;

impl Drop for Launching {
    fn drop(&mut self) {
        LAUNCHING.with(|flag| flag.set(false));
    }
}

/// Drops what `DEFERRED` holds, once `launch` has released the lock.
struct Deferred;

impl Drop for Deferred {
    fn drop(&mut self) {
        let deferred = DEFERRED.with(|deferred| std::mem::take(&mut *deferred.borrow_mut()));
        // A user future's `Drop` may panic; the registrations after it are dropped on the
        // way out all the same (a `Vec` drops its remaining items while unwinding).
        drop(deferred);
    }
}

fn launching() -> bool {
    LAUNCHING.with(Cell::get)
}

/// Holds a task's future until its first poll, so that a task tokio drops inside `spawn`
/// leaves its future to be dropped after the supervisor's lock (the future was never polled,
/// so it may move).
struct Unstarted<F: Send + 'static>(Option<F>);

impl<F: Send + 'static> Drop for Unstarted<F> {
    fn drop(&mut self) {
        if let Some(future) = self.0.take()
            && launching()
        {
            DEFERRED.with(|deferred| deferred.borrow_mut().push(Box::new(future)));
        }
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
        if launching() {
            // Dropped by tokio inside `launch`'s `spawn`, under the lock: done after it.
            let later = Registration {
                shared: Arc::clone(&self.shared),
                key: self.key,
                id: self.id,
                outcome: self.outcome,
            };
            DEFERRED.with(|deferred| deferred.borrow_mut().push(Box::new(later)));
            return;
        }
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
        let maybe_drained = state.closed && state.tasks.len() <= 1;
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
    struct Supervised<F, T> where F: Send, F: 'static {
        #[pin]
        stage: Stage<F>,
        failed: fn(&T) -> bool,
        registration: Registration,
    }
}

pin_project! {
    #[project = StageProj]
    enum Stage<F> where F: Send, F: 'static {
        Unstarted { future: Unstarted<F>, name: TaskName },
        Running { #[pin] future: CatchPanic<F> },
    }
}

impl<F: Future<Output = T> + Send + 'static, T> Future for Supervised<F, T> {
    type Output = Result<T, PanicError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let StageProj::Unstarted { future, name } = this.stage.as_mut().project() {
            let future = future.0.take().expect("an unstarted task holds its future");
            let caught = catch_panic(std::mem::replace(name, TaskName::from("")), future);
            this.stage.set(Stage::Running { future: caught });
        }
        let StageProj::Running { future } = this.stage.project() else {
            unreachable!("started above");
        };
        let output = ready!(future.poll(cx));
        this.registration.outcome = match &output {
            Ok(value) if (this.failed)(value) => Outcome::Failed,
            Ok(_) => Outcome::Finished,
            Err(_) => Outcome::Panicked,
        };
        Poll::Ready(output)
    }
}
