//! Plain data a supervisor hands out: the drain report, metrics, and the escalation record.

use std::fmt;
use std::time::Duration;

use crate::TaskName;

/// What [`Supervisor::shutdown`](crate::Supervisor::shutdown) saw: every task that ended
/// during the drain, by outcome.
///
/// Its `Display` is one line for a log: `all work finished: 2 tasks in 50ms`, or
/// `drain budget expired after 100ms; finished 1; aborted `slow``.
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
/// supervisor.spawn("flush", tokio::time::sleep(Duration::from_millis(10))).unwrap();
/// supervisor.spawn("stuck", std::future::pending::<()>()).unwrap();
/// let report = supervisor.shutdown(Duration::from_secs(1)).await;
/// assert!(report.budget_expired && !report.is_clean());
/// assert_eq!((report.finished.as_slice(), report.aborted.as_slice()), (&["flush".into()][..], &["stuck".into()][..]));
/// assert_eq!(report.elapsed, Duration::from_secs(1));
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainReport {
    /// Tasks that ran to completion within the grace period.
    pub finished: Vec<TaskName>,
    /// Restarting tasks that ended with an error (gave up, or stopped while failing).
    pub failed: Vec<TaskName>,
    /// Tasks that panicked during the drain (each panic was also logged with its backtrace).
    pub panicked: Vec<TaskName>,
    /// Tasks that were aborted: still running when the grace period ended, or aborted
    /// through their handle during the drain.
    pub aborted: Vec<TaskName>,
    /// Tasks that were aborted but still had not ended another `grace` later: stuck in
    /// blocking code, so their futures could not even be dropped. They are still running.
    pub unresponsive: Vec<TaskName>,
    /// `true` when the grace period ran out before every task had ended.
    pub budget_expired: bool,
    /// How long the drain took, aborts included.
    pub elapsed: Duration,
    /// The grace period that was granted.
    pub grace: Duration,
}

impl DrainReport {
    /// `true` when every task finished on its own within the grace period.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        !self.budget_expired
            && self.failed.is_empty()
            && self.panicked.is_empty()
            && self.aborted.is_empty()
            && self.unresponsive.is_empty()
    }
}

impl fmt::Display for DrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_clean() {
            let count = self.finished.len();
            let noun = if count == 1 { "task" } else { "tasks" };
            return write!(f, "all work finished: {count} {noun} in {:?}", self.elapsed);
        }
        if self.budget_expired {
            write!(f, "drain budget expired after {:?}", self.grace)?;
        } else {
            write!(f, "drained in {:?} with losses", self.elapsed)?;
        }
        write!(f, "; finished {}", self.finished.len())?;
        write_names(f, "failed", &self.failed)?;
        write_names(f, "panicked", &self.panicked)?;
        write_names(f, "aborted", &self.aborted)?;
        write_names(f, "unresponsive", &self.unresponsive)
    }
}

fn write_names(f: &mut fmt::Formatter<'_>, label: &str, names: &[TaskName]) -> fmt::Result {
    if names.is_empty() {
        return Ok(());
    }
    write!(f, "; {label}")?;
    for (index, name) in names.iter().enumerate() {
        let separator = if index == 0 { " " } else { ", " };
        write!(f, "{separator}`{name}`")?;
    }
    Ok(())
}

/// Cumulative counters of a [`Supervisor`](crate::Supervisor).
///
/// Every spawned task ends exactly once, and the task counters are read together, so
/// `spawned == completed + failed + panicked + aborted + running` holds in every snapshot.
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
/// supervisor.spawn("ok", async {}).unwrap().await.unwrap();
/// let _ = supervisor.spawn("bad", async { panic!("no") }).unwrap().await;
/// supervisor.close();
/// let _refused = supervisor.spawn("late", async {});
/// let metrics = supervisor.metrics();
/// assert_eq!((metrics.spawned, metrics.completed, metrics.panicked), (2, 1, 1));
/// assert_eq!((metrics.refused, metrics.running), (1, 0));
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SupervisorMetrics {
    /// Tasks accepted by `spawn` or `spawn_restarting`.
    pub spawned: u64,
    /// Tasks that ran to completion (a restarting task counts once, when its loop ends).
    pub completed: u64,
    /// Restarting tasks that ended with an error (gave up, or stopped while failing).
    pub failed: u64,
    /// Tasks that ended in a panic.
    pub panicked: u64,
    /// Tasks that were aborted before they finished.
    pub aborted: u64,
    /// Spawns refused because the supervisor was closed.
    pub refused: u64,
    /// Restarts performed by restarting tasks.
    pub restarts: u64,
    /// Tasks running when the snapshot was taken.
    pub running: u64,
}

/// Why a supervisor gave up: a restarting task failed more often than its policy allows.
///
/// Read it with [`Supervisor::escalation`](crate::Supervisor::escalation); see
/// [`Supervisor::spawn_restarting`](crate::Supervisor::spawn_restarting) for an example.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Escalation {
    /// The task that exceeded its limit.
    pub task: TaskName,
    /// Restarts it had within the window when it failed once more.
    pub restarts: u32,
    /// The policy's window.
    pub window: Duration,
    /// The last failure, as displayed.
    pub last_failure: String,
}

impl fmt::Display for Escalation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "task `{}` failed after {} restarts within {:?}: {}",
            self.task, self.restarts, self.window, self.last_failure
        )
    }
}
