//! `PanicError`: a panic caught inside a supervised task, with its payload.

use std::any::Any;
use std::backtrace::{Backtrace, BacktraceStatus};
use std::error::Error;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::TaskName;
use crate::internal::lock;

/// A panic caught inside a supervised task or future.
///
/// Carries the task's name, the panic message, where it panicked, a backtrace captured at
/// the panic site (see [`catch_panic`](crate::catch_panic) for how the backtrace is taken),
/// and the original payload, to re-raise ([`resume_unwind`](Self::resume_unwind)) or
/// downcast ([`take_payload`](Self::take_payload)). Cheap to clone: the details are shared.
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
    /// The original payload, for `resume_unwind` or a downcast. Behind a lock so that
    /// `PanicError` stays `Sync` (a payload is only `Send`); the clones share it, and the first
    /// one to take it has it.
    payload: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Drop for PanicDetails {
    fn drop(&mut self) {
        // The payload is user data: if its `Drop` panics, that is not allowed to unwind into
        // whatever drops the error (a worker, a report).
        let payload = self
            .payload
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(payload) = payload {
            crate::catch::drop_payload(payload);
        }
    }
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

    /// Like [`from_payload`](Self::from_payload), but takes the payload and keeps it, for
    /// [`resume_unwind`](Self::resume_unwind) or [`take_payload`](Self::take_payload). When the
    /// error is dropped with its payload, the payload is dropped safely: it is user data, and
    /// if its own `Drop` panics, that second payload is forgotten (leaked) instead of
    /// unwinding into the code that dropped the error.
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
        error.keep_payload(payload);
        error
    }

    pub(crate) fn keep_payload(&self, payload: Box<dyn Any + Send>) {
        let mut slot = lock(&self.details.payload);
        let previous = slot.replace(payload);
        drop(slot);
        if let Some(previous) = previous {
            crate::catch::drop_payload(previous);
        }
    }

    /// Takes the original panic payload out (the value given to `panic!` or `panic_any`), to
    /// downcast it. The clones of this error share it: the first to take it has it, and
    /// `None` comes back after that, or when the payload is unknown (an error made with
    /// [`from_payload`](Self::from_payload), which only borrows it).
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_supervise::catch_panic;
    ///
    /// #[derive(Debug, PartialEq)]
    /// struct Invariant(&'static str);
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let panic = catch_panic("ledger", async { std::panic::panic_any(Invariant("balance < 0")) })
    ///     .without_logging()
    ///     .await
    ///     .unwrap_err();
    /// let payload = panic.take_payload().unwrap();
    /// assert_eq!(*payload.downcast::<Invariant>().unwrap(), Invariant("balance < 0"));
    /// assert!(panic.take_payload().is_none()); // taken once
    /// # }
    /// ```
    #[must_use]
    pub fn take_payload(&self) -> Option<Box<dyn Any + Send>> {
        lock(&self.details.payload).take()
    }

    /// Re-raises the panic in the caller, with its original payload (as
    /// [`std::panic::resume_unwind`] does; the panic hook does not run again). When the payload
    /// was taken or is unknown, the message is raised instead, as a `String`.
    ///
    /// For a caller that wants a task's panic to be its own, as `JoinSet::join_all` does.
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_supervise::catch_panic;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let panic = catch_panic("worker", async { panic!("boom") })
    ///     .without_logging()
    ///     .await
    ///     .unwrap_err();
    /// let again = std::panic::catch_unwind(move || panic.resume_unwind()).unwrap_err();
    /// assert_eq!(*again.downcast::<&str>().unwrap(), "boom");
    /// # }
    /// ```
    pub fn resume_unwind(self) -> ! {
        let payload = self
            .take_payload()
            .unwrap_or_else(|| Box::new(self.message().to_owned()));
        std::panic::resume_unwind(payload)
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
                payload: Mutex::new(None),
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
    /// observed: a panic re-raised with `resume_unwind`, a panic tokio caught instead of us
    /// (a `tracing` subscriber that panicked while a caught panic was logged), or a panic
    /// hook installed by the application after ours (see
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
