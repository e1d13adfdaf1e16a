//! `RunOutcome`: what a periodic job may return.

use std::fmt;

/// The output of one periodic run: `()` always succeeds, a `Result` fails with its error.
///
/// A failed run is logged at warn with the error's `Display` and counted in
/// [`PeriodicReport::failed`](crate::PeriodicReport::failed); the schedule goes on.
///
/// # Examples
///
/// ```
/// use taskweave_periodic::RunOutcome;
///
/// assert!(().failure().is_none());
/// assert!(Ok::<u32, String>(3).failure().is_none());
/// let failed: Result<(), String> = Err("disk full".into());
/// assert_eq!(failed.failure().unwrap().to_string(), "disk full");
/// ```
pub trait RunOutcome {
    /// The error of a failed run, or `None` when the run succeeded.
    fn failure(&self) -> Option<&dyn fmt::Display>;
}

impl RunOutcome for () {
    fn failure(&self) -> Option<&dyn fmt::Display> {
        None
    }
}

impl<T, E: fmt::Display> RunOutcome for Result<T, E> {
    fn failure(&self) -> Option<&dyn fmt::Display> {
        self.as_ref().err().map(|error| error as &dyn fmt::Display)
    }
}
