//! Errors: why a task of a group produced no success. (A refused spawn is
//! `taskweave_supervise::SpawnError`, re-exported at the crate root.)

use std::error::Error;
use std::fmt;

use taskweave_supervise::PanicError;

/// How a task of a group failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum TaskFailure<E> {
    /// The task returned `Err`.
    Failed(E),
    /// The task panicked; the panic carries its message, location and backtrace (and was
    /// logged at error level).
    Panicked(PanicError),
    /// The item never ran: the caller's token was cancelled first (only from
    /// [`map_parallel_all`](crate::map_parallel_all) and [`map_parallel`](crate::map_parallel)).
    /// From `map_parallel`, also when every item it read ran but the cancel stopped it before
    /// it read the input's end, and the input's `size_hint` does not say it has no more.
    NotStarted,
}

impl<E> TaskFailure<E> {
    /// `true` when the task panicked.
    #[must_use]
    pub fn is_panic(&self) -> bool {
        matches!(self, TaskFailure::Panicked(_))
    }

    /// The task's own error, if it returned one.
    #[must_use]
    pub fn into_failed(self) -> Option<E> {
        match self {
            TaskFailure::Failed(error) => Some(error),
            TaskFailure::Panicked(_) | TaskFailure::NotStarted => None,
        }
    }
}

/// What a task inside `catch_panic` came to, as the groups report it: its value, its own
/// error or its panic.
pub(crate) fn from_caught<R, E>(
    outcome: Result<Result<R, E>, PanicError>,
) -> Result<R, TaskFailure<E>> {
    match outcome {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(TaskFailure::Failed(error)),
        Err(panic) => Err(TaskFailure::Panicked(panic)),
    }
}

impl<E: fmt::Display> fmt::Display for TaskFailure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskFailure::Failed(error) => fmt::Display::fmt(error, f),
            TaskFailure::Panicked(panic) => fmt::Display::fmt(panic, f),
            TaskFailure::NotStarted => f.write_str("not started: cancelled"),
        }
    }
}

// `E: Debug + Display` rather than `E: Error`, so that `anyhow::Error` works too.
impl<E: fmt::Debug + fmt::Display> Error for TaskFailure<E> {}
