//! Errors: a captured panic, a task that did not finish, and a refused spawn.

use std::backtrace::{Backtrace, BacktraceStatus};
use std::error::Error;
use std::fmt;
use std::sync::Arc;

use crate::TaskName;

/// A panic caught inside a supervised task or future.
///
/// Carries the task's name, the panic message, where it panicked and a backtrace captured at
/// the panic site (see [`catch_panic`](crate::catch_panic) for how the backtrace is taken).
/// Cheap to clone: the backtrace is shared.
///
/// # Examples
///
/// ```
/// use std::backtrace::BacktraceStatus;
/// use taskweave_supervise::catch_panic;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let panic = catch_panic("parser", async { panic!("unexpected token") })
///     .await
///     .unwrap_err();
/// assert_eq!(panic.name(), "parser");
/// assert_eq!(panic.message(), "unexpected token");
/// assert!(panic.location().unwrap().contains(".rs:"));
/// assert_eq!(panic.backtrace().status(), BacktraceStatus::Captured);
/// # }
/// ```
#[derive(Clone)]
pub struct PanicError {
    // One pointer: a `Result` or a results channel carrying a `PanicError` stays small (it
    // was 80 bytes inline), and a clone shares the backtrace.
    details: Arc<PanicDetails>,
}

struct PanicDetails {
    name: TaskName,
    message: String,
    location: Option<String>,
    backtrace: Backtrace,
}

impl PanicError {
    /// A `PanicError` for a panic payload caught elsewhere (a `JoinError::into_panic`, your own
    /// `catch_unwind`), where neither the location nor a backtrace is known.
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_supervise::PanicError;
    ///
    /// let payload = std::panic::catch_unwind(|| panic!("parse error")).unwrap_err();
    /// let panic = PanicError::from_payload("parser", payload.as_ref());
    /// assert_eq!(panic.message(), "parse error");
    /// assert_eq!(panic.location(), None);
    /// ```
    #[must_use]
    pub fn from_payload(
        name: impl Into<TaskName>,
        payload: &(dyn std::any::Any + Send),
    ) -> PanicError {
        crate::catch::panic_error_from_payload(name.into(), payload)
    }

    /// Like [`from_payload`](Self::from_payload), but takes the payload and drops it safely:
    /// a payload is user data, and if its own `Drop` panics, that second payload is forgotten
    /// (leaked) instead of unwinding into the code that caught the first panic.
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_supervise::PanicError;
    ///
    /// struct Bomb;
    /// impl Drop for Bomb {
    ///     fn drop(&mut self) {
    ///         panic!("a payload that panics when dropped");
    ///     }
    /// }
    ///
    /// let payload = std::panic::catch_unwind(|| std::panic::panic_any(Bomb)).unwrap_err();
    /// let panic = PanicError::from_panic("job", payload); // does not unwind
    /// assert_eq!(panic.message(), "Box<dyn Any>");
    /// ```
    #[must_use]
    pub fn from_panic(
        name: impl Into<TaskName>,
        payload: Box<dyn std::any::Any + Send>,
    ) -> PanicError {
        let error = Self::from_payload(name, payload.as_ref());
        crate::catch::drop_payload(payload);
        error
    }

    pub(crate) fn new(
        name: TaskName,
        message: String,
        location: Option<String>,
        backtrace: Backtrace,
    ) -> PanicError {
        PanicError {
            details: Arc::new(PanicDetails {
                name,
                message,
                location,
                backtrace,
            }),
        }
    }

    /// The name of the task that panicked.
    #[must_use]
    pub fn name(&self) -> &TaskName {
        &self.details.name
    }

    /// The panic message: the `&str` or `String` payload, or a placeholder for any other type.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.details.message
    }

    /// Where the panic happened (`file:line:column`), when the panic hook saw it.
    #[must_use]
    pub fn location(&self) -> Option<&str> {
        self.details.location.as_deref()
    }

    /// The backtrace captured at the panic site.
    ///
    /// Its [`status`](Backtrace::status) is `Disabled` when the panic site could not be
    /// observed: a panic re-raised with `resume_unwind`, a panic in a task's `Drop` caught by
    /// tokio, or a panic hook installed by the application after ours (see
    /// [`catch_panic`](crate::catch_panic)).
    pub fn backtrace(&self) -> &Backtrace {
        &self.details.backtrace
    }
}

impl fmt::Display for PanicError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task `{}` panicked", self.name())?;
        if let Some(location) = self.location() {
            write!(f, " at {location}")?;
        }
        write!(f, ": {}", self.message())
    }
}

impl fmt::Debug for PanicError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("PanicError");
        debug
            .field("name", self.name())
            .field("message", &self.message())
            .field("location", &self.location());
        if self.backtrace().status() == BacktraceStatus::Captured {
            debug.field("backtrace", &format_args!("\n{}", self.backtrace()));
        }
        debug.finish()
    }
}

impl Error for PanicError {}

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

/// [`Supervisor::spawn`](crate::Supervisor::spawn) refused the future; it is handed back.
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
/// supervisor.close();
/// let refused = supervisor.spawn("report", async { "generated" }).unwrap_err();
/// assert_eq!(refused.name(), "report");
/// // Nothing is lost: the caller decides what to do with the work.
/// assert_eq!(refused.into_inner().await, "generated");
/// # }
/// ```
pub struct SpawnError<F> {
    pub(crate) name: TaskName,
    pub(crate) future: F,
}

impl<F> SpawnError<F> {
    /// The name the refused task would have had.
    #[must_use]
    pub fn name(&self) -> &TaskName {
        &self.name
    }

    /// Takes back the refused future, to run it elsewhere or drop it knowingly.
    #[must_use]
    pub fn into_inner(self) -> F {
        self.future
    }
}

impl<F> fmt::Debug for SpawnError<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpawnError")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<F> fmt::Display for SpawnError<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "supervisor closed, task `{}` refused", self.name)
    }
}

impl<F> Error for SpawnError<F> {}
