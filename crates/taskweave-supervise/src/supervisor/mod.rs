//! `Supervisor`: named tasks that share a token, refuse work after close and drain by deadline.

mod drain;
mod registration;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use slab::Slab;
use tokio::sync::Notify;
use tokio::task::{AbortHandle, Id};
use tokio_util::sync::CancellationToken;

use crate::{Escalation, SupervisorMetrics, TaskName};

pub(crate) use registration::current_runtime;

/// Owns a set of named, panic-capturing tasks and stops them together.
///
/// - [`spawn`](Self::spawn) starts a named task through [`catch_panic`](crate::catch_panic), so
///   a panic is logged with a backtrace, counted, and handed to the task's
///   [`TaskHandle`](crate::TaskHandle); the other tasks and the process keep running.
/// - [`close`](Self::close) refuses every later spawn with [`SpawnError`](crate::SpawnError),
///   which hands the future back. Closing and registering happen under one lock, so no spawn
///   can slip in after a drain has started.
/// - [`shutdown`](Self::shutdown) closes, cancels the supervisor's [`token`](Self::token),
///   waits up to a grace period, aborts whatever is still running and returns a
///   [`DrainReport`](crate::DrainReport) naming the tasks that finished, panicked and were
///   aborted.
/// - [`spawn_restarting`](Self::spawn_restarting) keeps a long-lived task alive with backoff
///   and an intensity limit; past the limit the supervisor cancels its token and records an
///   [`Escalation`].
///
/// `Supervisor` is a cheap handle: clones share the same tasks.
///
/// # Memory
///
/// A task's future is dropped when it ends. On the multi-thread runtime, the rest of the task's
/// memory (tokio's task cell) may be kept for a while, for up to 32 ended tasks: it is freed in
/// a batch by a spawn once 16 are pending, when a [`wait`](Self::wait) or
/// [`shutdown`](Self::shutdown) completes, or when the supervisor is dropped, on that thread
/// rather than on the worker that ran the task: memory freed by the thread that allocated it
/// avoids contention on the allocator (measured in `docs/benchmarks.md`, supervise section).
/// A kept cell also keeps the runtime's handle alive if the supervisor outlives the runtime.
/// Tasks whose future or output is larger than 1 KiB are freed at once.
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
    /// Tasks that called `shutdown` whose own entry had no abort handle yet when their
    /// deadline passed (on the multi-thread runtime a task can run before its `launch`
    /// completes): `launch` spares them, as the sweep spares its caller. At most
    /// `SPARED_MAX`, the oldest dropped first (an id of a task that is not ours stays until
    /// then).
    spared: Vec<Id>,
    next_id: u64,
    tasks: Slab<Entry>,
    /// One log per `shutdown` call in progress: the outcomes of the tasks that end during it.
    drains: Vec<(u64, DrainLog)>,
    /// Abort handles of ended tasks on the multi-thread runtime, dropped in a batch by a later
    /// `register` or at the end of a drain, outside the lock (`registration::RETIRED_MAX`).
    retired: Vec<AbortHandle>,
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
    /// Whether `launch` aborts the task `task` at once: a drain deadline has passed, and the
    /// task is not the caller of that drain (which is left running).
    fn aborts_at_launch(&mut self, task: Id) -> bool {
        if !self.aborting {
            return false;
        }
        match self.spared.iter().position(|spared| *spared == task) {
            Some(index) => {
                self.spared.swap_remove(index);
                false
            }
            None => true,
        }
    }

    /// Marks the drain's deadline as passed, sparing the caller `me` if its own entry has no
    /// abort handle yet (see `spared`).
    fn start_aborting(&mut self, me: Option<Id>) {
        self.aborting = true;
        if let Some(me) = me
            && !self.tasks.iter().any(|(_, entry)| entry.task() == Some(me))
            && !self.spared.contains(&me)
        {
            if self.spared.len() >= SPARED_MAX {
                self.spared.remove(0);
            }
            self.spared.push(me);
        }
    }

    /// Closed with at most one task left: a drain waiter may be done (the one left may be the
    /// waiter itself, which checks), so it is woken.
    fn may_be_drained(&self) -> bool {
        self.closed && self.tasks.len() <= 1
    }

    /// Closed, and no task left but (optionally) the caller's own.
    fn is_drained(&self, except: Option<Id>) -> bool {
        self.closed
            && match self.tasks.len() {
                0 => true,
                1 => except.is_some() && self.tasks.iter().all(|(_, entry)| entry.task() == except),
                _ => false,
            }
    }
}

/// The most drain callers `State::spared` remembers.
const SPARED_MAX: usize = 16;

struct Entry {
    id: u64,
    name: TaskName,
    /// Set once the task is spawned (see `launch`).
    abort: Option<AbortHandle>,
}

impl Entry {
    /// The task's id, once it is spawned.
    fn task(&self) -> Option<Id> {
        self.abort.as_ref().map(AbortHandle::id)
    }
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
    /// `spawned == completed + failed + panicked + aborted + running` holds in every snapshot.
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

#[cfg(all(test, not(taskweave_loom)))]
mod tests;
