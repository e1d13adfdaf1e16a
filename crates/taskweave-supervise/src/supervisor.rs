//! `Supervisor`: named tasks that share a token, refuse work after close and drain by deadline.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use slab::Slab;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::{AbortHandle, Id};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{CatchPanic, DrainReport, Escalation, PanicError, SpawnError, TaskHandle, TaskName};
use crate::{SupervisorMetrics, catch_panic};

/// Owns a set of named, panic-capturing tasks and stops them together.
///
/// - [`spawn`](Self::spawn) starts a named task through [`catch_panic`], so a panic is logged
///   with a backtrace, counted, and handed to the task's [`TaskHandle`]; the other tasks and
///   the process keep running.
/// - [`close`](Self::close) refuses every later spawn with [`SpawnError`], which hands the
///   future back. Closing and registering happen under one lock, so no spawn can slip in
///   after a drain has started.
/// - [`shutdown`](Self::shutdown) closes, cancels the supervisor's [`token`](Self::token),
///   waits up to a grace period, aborts whatever is still running and returns a
///   [`DrainReport`] naming the tasks that finished, panicked and were aborted.
/// - [`spawn_restarting`](Self::spawn_restarting) keeps a long-lived task alive with backoff
///   and an intensity limit; past the limit the supervisor cancels its token and records an
///   [`Escalation`].
///
/// `Supervisor` is a cheap handle: clones share the same tasks.
///
/// # Comparison to tokio-util's `TaskTracker`
///
/// `TaskTracker` keeps accepting tasks after
/// `close()`, knows no names, cannot abort stragglers and does not catch panics. Use
/// `TaskTracker` when you only need "wait for everything I spawned" and spawn cost matters
/// more than reporting; use `Supervisor` when shutdown must say what it left behind.
///
/// # Examples
///
/// The two cases of the reference material: work that fits the drain budget, and work that
/// does not.
///
/// ```
/// use std::time::Duration;
/// use taskweave_supervise::Supervisor;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let supervisor = Supervisor::new(CancellationToken::new());
/// supervisor
///     .spawn("quick", tokio::time::sleep(Duration::from_millis(50)))
///     .unwrap();
/// let report = supervisor.shutdown(Duration::from_millis(100)).await;
/// assert!(report.is_clean());
/// assert_eq!(report.to_string(), "all work finished: 1 task in 50ms");
/// assert!(supervisor.spawn("late", async {}).is_err());
///
/// let supervisor = Supervisor::new(CancellationToken::new());
/// supervisor
///     .spawn("slow", tokio::time::sleep(Duration::from_secs(2)))
///     .unwrap();
/// let report = supervisor.shutdown(Duration::from_millis(100)).await;
/// assert!(report.budget_expired);
/// assert_eq!(report.aborted, ["slow"]);
/// # }
/// ```
#[derive(Clone)]
pub struct Supervisor {
    shared: Arc<Shared>,
}

struct Shared {
    token: CancellationToken,
    state: Mutex<State>,
    /// Notified (after the lock is released) whenever the supervisor is closed and its last
    /// task has ended.
    drained: Notify,
    /// The one counter updated outside the lock.
    restarts: AtomicU64,
    escalation: OnceLock<Escalation>,
}

#[derive(Default)]
struct State {
    closed: bool,
    /// Set once a drain deadline has passed: a task whose registration completes after this
    /// point is aborted at once instead of being missed by the abort sweep.
    aborting: bool,
    next_id: u64,
    tasks: Slab<Entry>,
    /// One log per `shutdown` call in progress: the outcomes of the tasks that end during it.
    drains: Vec<(u64, DrainLog)>,
    next_drain: u64,
    // Counters live under the lock that registration and removal take anyway: no extra
    // atomic operations per task, and `metrics()` reads a consistent snapshot.
    spawned: u64,
    completed: u64,
    failed: u64,
    panicked: u64,
    aborted: u64,
    refused: u64,
}

impl State {
    /// Closed, and no task left but (optionally) the caller's own.
    fn is_drained(&self, except: Option<Id>) -> bool {
        self.closed
            && match self.tasks.len() {
                0 => true,
                1 => except.is_some() && self.tasks.iter().all(|(_, entry)| entry.task == except),
                _ => false,
            }
    }
}

struct Entry {
    id: u64,
    name: TaskName,
    /// Set once the task is spawned (see `launch`).
    abort: Option<AbortHandle>,
    task: Option<Id>,
}

#[derive(Default)]
struct DrainLog {
    finished: Vec<TaskName>,
    failed: Vec<TaskName>,
    panicked: Vec<TaskName>,
    aborted: Vec<TaskName>,
}

impl Supervisor {
    /// A supervisor whose token is a child of `token`: cancelling `token` cancels every task
    /// that watches [`token`](Self::token); a shutdown or an escalation of the supervisor never
    /// cancels `token` itself.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskweave_supervise::Supervisor;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let app = CancellationToken::new();
    /// let consumers = Supervisor::new(app.clone());
    /// let token = consumers.token();
    /// consumers.spawn("orders-consumer", async move { token.cancelled().await }).unwrap();
    /// let report = consumers.shutdown(Duration::from_secs(5)).await;
    /// assert_eq!(report.finished, ["orders-consumer"]);
    /// assert!(!app.is_cancelled());
    /// # }
    /// ```
    #[must_use]
    pub fn new(token: CancellationToken) -> Self {
        Supervisor {
            shared: Arc::new(Shared {
                token: token.child_token(),
                state: Mutex::new(State::default()),
                drained: Notify::new(),
                restarts: AtomicU64::new(0),
                escalation: OnceLock::new(),
            }),
        }
    }

    /// The supervisor's token: give it (or a child of it) to the tasks you spawn so that they
    /// stop when the supervisor shuts down or escalates.
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_supervise::Supervisor;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// let parent = CancellationToken::new();
    /// let supervisor = Supervisor::new(parent.clone());
    /// parent.cancel();
    /// assert!(supervisor.token().is_cancelled()); // parent → supervisor, never the reverse
    /// ```
    #[must_use]
    pub fn token(&self) -> CancellationToken {
        self.shared.token.clone()
    }

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
    /// assert_eq!(refused.to_string(), "supervisor closed, task `late` refused");
    /// assert_eq!(refused.into_inner().await, 4);
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`SpawnError`] with the future when [`close`](Self::close) (or `shutdown`) has run.
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
            None => Err(SpawnError { name, future }),
        }
    }

    /// Stops accepting tasks. Returns `true` if this call closed it, `false` if it was already
    /// closed. Running tasks are not touched; see [`shutdown`](Self::shutdown).
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
    /// assert!(supervisor.close());
    /// assert!(!supervisor.close()); // idempotent
    /// assert!(supervisor.is_closed());
    /// assert!(supervisor.spawn("late", async {}).is_err());
    /// # }
    /// ```
    pub fn close(&self) -> bool {
        let was_open = !std::mem::replace(&mut self.state().closed, true);
        if was_open {
            // Wakes a `wait` that started before the close, whatever is left running.
            self.shared.drained.notify_waiters();
        }
        was_open
    }

    /// `true` after [`close`](Self::close) or [`shutdown`](Self::shutdown).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.state().closed
    }

    /// The number of tasks that are still running.
    #[must_use]
    pub fn len(&self) -> usize {
        self.state().tasks.len()
    }

    /// `true` when no task is running.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The names of the tasks that are still running, in no particular order.
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
    /// supervisor.spawn("listener", std::future::pending::<()>()).unwrap();
    /// assert_eq!(supervisor.len(), 1);
    /// assert_eq!(supervisor.running(), ["listener"]);
    /// # }
    /// ```
    #[must_use]
    pub fn running(&self) -> Vec<TaskName> {
        self.state()
            .tasks
            .iter()
            .map(|(_, entry)| entry.name.clone())
            .collect()
    }

    /// Cumulative counters since the supervisor was created.
    ///
    /// The task counters are read together under the supervisor's lock, so
    /// `spawned == completed + panicked + aborted + running` holds in every snapshot.
    #[must_use]
    pub fn metrics(&self) -> SupervisorMetrics {
        let state = self.state();
        SupervisorMetrics {
            spawned: state.spawned,
            completed: state.completed,
            failed: state.failed,
            panicked: state.panicked,
            aborted: state.aborted,
            refused: state.refused,
            // Relaxed: an independent, increment-only counter.
            restarts: self.shared.restarts.load(Ordering::Relaxed),
            running: state.tasks.len() as u64,
        }
    }

    /// Why the supervisor gave up, if a restarting task exceeded its intensity limit.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskweave_supervise::{RestartPolicy, Supervisor};
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let supervisor = Supervisor::new(CancellationToken::new());
    /// let policy = RestartPolicy::new(1, Duration::from_secs(60));
    /// let task = supervisor
    ///     .spawn_restarting("poller", policy, |_token| async { Err("upstream down") })
    ///     .unwrap();
    /// assert!(task.await.unwrap().is_err());
    /// let escalation = supervisor.escalation().unwrap();
    /// assert_eq!(escalation.task, "poller");
    /// assert_eq!(escalation.last_failure, "upstream down");
    /// assert!(supervisor.token().is_cancelled());
    /// # }
    /// ```
    #[must_use]
    pub fn escalation(&self) -> Option<&Escalation> {
        self.shared.escalation.get()
    }

    /// Waits until the supervisor is closed and every task has ended. Waits forever if nobody
    /// closes it. Unlike [`shutdown`](Self::shutdown), it has no deadline and cancels nothing.
    /// Called from one of the supervisor's own tasks, it waits for all the others.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskweave_supervise::Supervisor;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let supervisor = Supervisor::new(CancellationToken::new());
    /// supervisor.spawn("flush", tokio::time::sleep(Duration::from_millis(30))).unwrap();
    /// supervisor.close();
    /// supervisor.wait().await;
    /// assert!(supervisor.is_empty());
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future has no effect on the supervisor.
    pub async fn wait(&self) {
        self.wait_drained(tokio::task::try_id()).await;
    }

    async fn wait_drained(&self, except: Option<Id>) {
        loop {
            let notified = self.shared.drained.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a drain that completes right after the check
            // still wakes this waiter.
            notified.as_mut().enable();
            if self.state().is_drained(except) {
                return;
            }
            notified.await;
        }
    }

    /// Closes the supervisor, cancels its token, waits up to `grace` for the tasks to end, then
    /// aborts the rest and reports.
    ///
    /// The report names every task that ended during this call: finished, failed (a
    /// restarting task that ended with an error), panicked, or aborted (by the deadline or by
    /// its handle). Aborted tasks are awaited until their futures are dropped, which takes one
    /// scheduling round; a task stuck in blocking code cannot be dropped, so that second wait
    /// is bounded by `grace` too and such tasks are named as `unresponsive`. The call returns
    /// within `2 × grace` at most, after about `grace` when something had to be aborted.
    ///
    /// Overlapping calls each report the tasks that ended during their own call. Called from
    /// one of the supervisor's own tasks (a control task that decides to stop everything), it
    /// drains and reports all the others and leaves the caller running.
    ///
    /// # Examples
    ///
    /// See the [type-level example](Self).
    ///
    /// # Panics
    ///
    /// Panics if `grace` is zero: a drain needs time; to abort at once, pass the smallest
    /// grace that suits you (`Duration::from_nanos(1)`).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe as a report: dropping the future leaves the supervisor closed and its
    /// token cancelled, tasks keep ending on their own, and the report is lost. Call it again
    /// to wait once more.
    pub async fn shutdown(&self, grace: Duration) -> DrainReport {
        assert!(
            !grace.is_zero(),
            "Supervisor::shutdown: grace must be greater than zero"
        );
        let started = Instant::now();
        let me = tokio::task::try_id();
        let log = DrainLogGuard::open(self);
        self.close();
        self.shared.token.cancel();
        tracing::debug!(grace = ?grace, "supervisor draining");

        let budget_expired = tokio::time::timeout(grace, self.wait_drained(me))
            .await
            .is_err();
        let mut unresponsive = Vec::new();
        if budget_expired {
            let stragglers: Vec<AbortHandle> = {
                let mut state = self.state();
                state.aborting = true;
                state
                    .tasks
                    .iter()
                    .filter(|(_, entry)| me.is_none() || entry.task != me)
                    .filter_map(|(_, entry)| entry.abort.clone())
                    .collect()
            };
            // Aborting outside the lock: an abort never runs the task's drop inline today, but
            // the lock must not depend on that.
            for straggler in stragglers {
                straggler.abort();
            }
            if tokio::time::timeout(grace, self.wait_drained(me))
                .await
                .is_err()
            {
                unresponsive = self
                    .state()
                    .tasks
                    .iter()
                    .filter(|(_, entry)| me.is_none() || entry.task != me)
                    .map(|(_, entry)| entry.name.clone())
                    .collect();
            }
        }
        let log = log.take();
        let report = DrainReport {
            finished: log.finished,
            failed: log.failed,
            panicked: log.panicked,
            aborted: log.aborted,
            unresponsive,
            budget_expired,
            elapsed: started.elapsed(),
            grace,
        };
        if report.is_clean() {
            tracing::debug!(%report, "supervisor drained");
        } else {
            tracing::warn!(%report, "supervisor drained with losses");
        }
        report
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
            task: None,
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
        let mut state = self.state();
        let aborting = state.aborting;
        let registered = match state.tasks.get_mut(key) {
            Some(entry) if entry.id == id => {
                entry.abort = Some(abort.clone());
                entry.task = Some(join.id());
                true
            }
            // Already finished and removed (the slot may even hold a newer task).
            _ => false,
        };
        drop(state);
        // A drain deadline passed between `register` and here: the sweep missed this task.
        if registered && aborting {
            abort.abort();
        }
        TaskHandle::new(name, join)
    }

    pub(crate) fn count_restart(&self) {
        // Relaxed: an independent, increment-only counter.
        self.shared.restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// Records the first escalation, then cancels the supervisor's token.
    pub(crate) fn escalate(&self, escalation: Escalation) {
        tracing::error!(%escalation, "supervisor escalating: cancelling its token");
        let _ = self.shared.escalation.set(escalation);
        self.shared.token.cancel();
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
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

impl Shared {
    // A panic never happens while the lock is held (no user code runs under it), but if one
    // did, the state is still consistent, so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("Supervisor")
            .field("closed", &state.closed)
            .field("running", &state.tasks.len())
            .field("cancelled", &self.shared.token.is_cancelled())
            .finish_non_exhaustive()
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

/// This `shutdown` call's drain log; dropping it (a cancelled `shutdown`) removes the log.
struct DrainLogGuard<'a> {
    supervisor: &'a Supervisor,
    id: u64,
}

impl<'a> DrainLogGuard<'a> {
    fn open(supervisor: &'a Supervisor) -> Self {
        let mut state = supervisor.state();
        let id = state.next_drain;
        state.next_drain += 1;
        state.drains.push((id, DrainLog::default()));
        DrainLogGuard { supervisor, id }
    }

    fn take(self) -> DrainLog {
        let mut state = self.supervisor.state();
        let position = state.drains.iter().position(|(id, _)| *id == self.id);
        position.map_or_else(DrainLog::default, |index| state.drains.swap_remove(index).1)
    }
}

impl Drop for DrainLogGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.supervisor.state();
        state.drains.retain(|(id, _)| *id != self.id);
    }
}
