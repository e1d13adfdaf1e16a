//! Errors: a captured panic, a task that did not finish, and a refused spawn.

mod panic;

use std::error::Error;
use std::fmt;

use crate::TaskName;

pub use panic::PanicError;

/// Why awaiting a [`TaskHandle`](crate::TaskHandle) produced no value.
///
/// # Examples
///
/// ```
/// use taskweave_supervise::{TaskError, spawn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// match spawn("worker", async { panic!("boom") }).await {
///     Err(TaskError::Panicked(panic)) => assert_eq!(panic.message(), "boom"),
///     other => unreachable!("{other:?}"),
/// }
/// # }
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum TaskError {
    /// The task panicked; the panic was logged and is handed back here.
    Panicked(PanicError),
    /// The task was aborted (by its handle, by a supervisor's drain deadline, or because the
    /// runtime shut down) before it finished.
    Aborted {
        /// The aborted task's name.
        name: TaskName,
    },
}

impl TaskError {
    /// The name of the task this error is about.
    #[must_use]
    pub fn name(&self) -> &TaskName {
        match self {
            TaskError::Panicked(panic) => panic.name(),
            TaskError::Aborted { name } => name,
        }
    }

    /// `true` when the task panicked.
    #[must_use]
    pub fn is_panic(&self) -> bool {
        matches!(self, TaskError::Panicked(_))
    }

    /// `true` when the task was aborted.
    #[must_use]
    pub fn is_aborted(&self) -> bool {
        matches!(self, TaskError::Aborted { .. })
    }

    /// The captured panic, if the task panicked.
    #[must_use]
    pub fn into_panic(self) -> Option<PanicError> {
        match self {
            TaskError::Panicked(panic) => Some(panic),
            TaskError::Aborted { .. } => None,
        }
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskError::Panicked(panic) => fmt::Display::fmt(panic, f),
            TaskError::Aborted { name } => write!(f, "task `{name}` was aborted"),
        }
    }
}

// Display already shows the panic, so it is not repeated as a `source()`.
impl Error for TaskError {}

impl From<PanicError> for TaskError {
    fn from(panic: PanicError) -> Self {
        TaskError::Panicked(panic)
    }
}

/// A refused spawn; the future is handed back, whatever the reason.
///
/// One type for every crate of the workspace that spawns on the caller's behalf: a
/// [`Supervisor`](crate::Supervisor) refuses with `Closed`; the task groups of
/// `taskweave-group` refuse with `Full` or `Cancelled` (and re-export this type).
///
/// # Examples
///
/// ```
/// use taskweave_supervise::{SpawnError, Supervisor};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let supervisor = Supervisor::new(CancellationToken::new());
/// supervisor.close();
/// let refused = supervisor.spawn("report", async { "generated" }).unwrap_err();
/// assert!(matches!(refused, SpawnError::Closed(_)));
/// assert_eq!(refused.to_string(), "spawn refused: closed");
/// // Nothing is lost: the caller decides what to do with the work.
/// assert_eq!(refused.into_inner().await, "generated");
/// # }
/// ```
#[derive(PartialEq, Eq)]
#[non_exhaustive]
pub enum SpawnError<F> {
    /// The supervisor (or group) was closed: it takes no more tasks.
    Closed(F),
    /// Every slot of a limit is taken (only from the non-waiting `try_spawn`s).
    Full(F),
    /// The group's token is cancelled (a task failed, the parent was cancelled, or the group
    /// was waited for): a new task would only see a cancelled token.
    Cancelled(F),
}

impl<F> SpawnError<F> {
    /// Takes back the refused future, to run it elsewhere or drop it knowingly.
    #[must_use]
    pub fn into_inner(self) -> F {
        match self {
            SpawnError::Closed(future)
            | SpawnError::Full(future)
            | SpawnError::Cancelled(future) => future,
        }
    }
}

impl<F> fmt::Debug for SpawnError<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpawnError::Closed(_) => "Closed(..)",
            SpawnError::Full(_) => "Full(..)",
            SpawnError::Cancelled(_) => "Cancelled(..)",
        })
    }
}

impl<F> fmt::Display for SpawnError<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpawnError::Closed(_) => "spawn refused: closed",
            SpawnError::Full(_) => "spawn refused: full",
            SpawnError::Cancelled(_) => "spawn refused: cancelled",
        })
    }
}

impl<F> Error for SpawnError<F> {}
