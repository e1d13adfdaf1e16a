//! Errors: why a job was not accepted (the job is handed back) and why a job failed.

use std::error::Error;
use std::fmt;

use taskweave_supervise::PanicError;

/// [`WorkerPool::submit`](crate::WorkerPool::submit) did not accept the job; it is handed back.
#[derive(PartialEq, Eq)]
#[non_exhaustive]
pub enum SubmitError<J> {
    /// The queue was full and the overflow policy is [`Overflow::Reject`](crate::Overflow).
    Full(J),
    /// The pool is closed (by `close`, `close_within`, or its token).
    Closed(J),
    /// The caller's token was cancelled while waiting for queue space.
    Cancelled(J),
}

impl<J> SubmitError<J> {
    /// Takes back the job that was not accepted.
    #[must_use]
    pub fn into_inner(self) -> J {
        match self {
            SubmitError::Full(job) | SubmitError::Closed(job) | SubmitError::Cancelled(job) => job,
        }
    }
}

impl<J> fmt::Debug for SubmitError<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubmitError::Full(_) => f.write_str("Full(..)"),
            SubmitError::Closed(_) => f.write_str("Closed(..)"),
            SubmitError::Cancelled(_) => f.write_str("Cancelled(..)"),
        }
    }
}

impl<J> fmt::Display for SubmitError<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SubmitError::Full(_) => "queue full",
            SubmitError::Closed(_) => "pool closed",
            SubmitError::Cancelled(_) => "submit cancelled",
        })
    }
}

impl<J> Error for SubmitError<J> {}

/// [`WorkerPool::try_submit`](crate::WorkerPool::try_submit) did not accept the job; it is
/// handed back.
#[derive(PartialEq, Eq)]
#[non_exhaustive]
pub enum TrySubmitError<J> {
    /// The queue was full (with any overflow policy but drop-oldest); answer "429".
    Full(J),
    /// The pool is closed.
    Closed(J),
}

impl<J> TrySubmitError<J> {
    /// Takes back the job that was not accepted.
    #[must_use]
    pub fn into_inner(self) -> J {
        match self {
            TrySubmitError::Full(job) | TrySubmitError::Closed(job) => job,
        }
    }

    /// `true` when the queue was full (the pool is still open).
    #[must_use]
    pub fn is_full(&self) -> bool {
        matches!(self, TrySubmitError::Full(_))
    }
}

impl<J> fmt::Debug for TrySubmitError<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySubmitError::Full(_) => f.write_str("Full(..)"),
            TrySubmitError::Closed(_) => f.write_str("Closed(..)"),
        }
    }
}

impl<J> fmt::Display for TrySubmitError<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TrySubmitError::Full(_) => "queue full",
            TrySubmitError::Closed(_) => "pool closed",
        })
    }
}

impl<J> Error for TrySubmitError<J> {}

impl<J> From<TrySubmitError<J>> for SubmitError<J> {
    fn from(error: TrySubmitError<J>) -> Self {
        match error {
            TrySubmitError::Full(job) => SubmitError::Full(job),
            TrySubmitError::Closed(job) => SubmitError::Closed(job),
        }
    }
}

/// Why [`WorkerPool::submit_many`](crate::WorkerPool::submit_many) or
/// [`try_submit_many`](crate::WorkerPool::try_submit_many) did not accept every job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The queue was full: `try_submit_many`, or the reject policy.
    Full,
    /// The pool is closed (by `close`, `close_within`, or its token).
    Closed,
    /// The caller's token was cancelled (before the batch, or while it waited for space).
    Cancelled,
}

/// A batch that was not accepted whole. The batch is accepted in order, so the accepted jobs
/// are a prefix of it: they are queued (or, with drop-oldest, dropped later like any queued
/// job) and their indices are `accepted`; every job after them is handed back in `refused`,
/// in the order given.
#[non_exhaustive]
pub struct SubmitManyError<J> {
    /// The indices of the jobs accepted before the refusal (possibly none).
    pub accepted: std::ops::Range<u64>,
    /// The jobs not accepted, in the order they were given.
    pub refused: Vec<J>,
    /// Why they were not accepted.
    pub reason: Refusal,
}

impl<J> SubmitManyError<J> {
    /// Takes back the jobs that were not accepted.
    #[must_use]
    pub fn into_refused(self) -> Vec<J> {
        self.refused
    }
}

impl<J> fmt::Debug for SubmitManyError<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubmitManyError")
            .field("accepted", &self.accepted)
            .field("refused", &self.refused.len())
            .field("reason", &self.reason)
            .finish()
    }
}

impl<J> fmt::Display for SubmitManyError<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reason = match self.reason {
            Refusal::Full => "queue full",
            Refusal::Closed => "pool closed",
            Refusal::Cancelled => "submit cancelled",
        };
        write!(
            f,
            "{} of {} jobs not accepted: {reason}",
            self.refused.len(),
            self.refused.len() as u64 + (self.accepted.end - self.accepted.start)
        )
    }
}

impl<J> Error for SubmitManyError<J> {}

/// Why a job produced no value: its handler returned an error or panicked.
#[derive(Debug)]
#[non_exhaustive]
pub enum JobError<E> {
    /// The handler returned `Err`.
    Failed(E),
    /// The handler panicked (logged with its backtrace); the worker kept serving.
    Panicked(PanicError),
}

impl<E> JobError<E> {
    /// `true` when the handler panicked.
    #[must_use]
    pub fn is_panic(&self) -> bool {
        matches!(self, JobError::Panicked(_))
    }

    /// The handler's error, if it returned one.
    #[must_use]
    pub fn into_failed(self) -> Option<E> {
        match self {
            JobError::Failed(error) => Some(error),
            JobError::Panicked(_) => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for JobError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobError::Failed(error) => write!(f, "job failed: {error}"),
            JobError::Panicked(panic) => fmt::Display::fmt(panic, f),
        }
    }
}

impl<E: Error + 'static> Error for JobError<E> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            JobError::Failed(error) => Some(error),
            JobError::Panicked(_) => None,
        }
    }
}

/// The outcome of one job: the handler's value, or why there is none.
pub type JobResult<R, E> = Result<R, JobError<E>>;
