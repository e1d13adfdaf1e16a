//! `RunOutcome`: what a periodic job may return.

use std::fmt;

/// The output of one periodic run: `()` always succeeds, a `Result` fails with its error.
///
/// A failed run is logged at warn with the error's `Display` and counted in
/// [`PeriodicReport::failed`](crate::PeriodicReport::failed); the schedule goes on.
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
