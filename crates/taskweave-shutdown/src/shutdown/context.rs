//! `PhaseContext`: a phase's (or a resource's) view of the shutdown.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::critical::{CriticalSection, open_section};
use super::{Inner, lock};

/// A phase's (or a resource's) view of the shutdown: its deadline, a token cancelled when
/// the deadline passes, and a place to report what it abandoned.
pub struct PhaseContext {
    pub(super) name: String,
    pub(super) deadline: Instant,
    pub(super) cut_off: Instant,
    pub(super) step: u64,
    pub(super) inner: Arc<Inner>,
    pub(super) token: CancellationToken,
    pub(super) abandoned: Arc<Mutex<Vec<String>>>,
}

impl PhaseContext {
    /// The step's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// When the step should be done: 90 % into its grant (tokio's clock). Its token is
    /// cancelled then; the step is cut off at the end of its grant (later only while it
    /// holds a [`critical_section`](Self::critical_section)), so the last 10 % is its time
    /// to stop and report.
    #[must_use]
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The time left until [`deadline`](Self::deadline): pass it to a drain that takes a
    /// timeout, such as `WorkerPool::close_within`.
    #[must_use]
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Cancelled at the [`deadline`](Self::deadline); the step has the rest of its grant to
    /// notice, [`abandon`](Self::abandon) what it leaves, and return.
    #[must_use]
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Records something the step leaves undone (jobs handed back, messages not flushed),
    /// for the report.
    pub fn abandon(&self, what: impl Into<String>) {
        lock(&self.abandoned).push(what.into());
    }

    /// Opens a critical section owned by this step: while it is open the step is not cut
    /// off at the end of its grant (it is waited for until the hard deadline), and the
    /// shutdown's critical-section wait waits for it too. Sections opened with
    /// [`Shutdown::critical_section`](crate::Shutdown::critical_section) (by components) do
    /// not hold a step back.
    ///
    /// Returns `None` once the step is past the end of its grant, or the resources are
    /// closing: do not start the work then.
    #[must_use = "the critical section ends when the guard is dropped"]
    pub fn critical_section(&self, name: impl Into<String>) -> Option<CriticalSection> {
        if Instant::now() >= self.cut_off {
            return None;
        }
        let mut state = lock(&self.inner.state);
        // The clock read above can race the orchestrator's cut-off on another thread; its
        // decision, taken under this lock, is what counts.
        if state.critical_closed_for_good || state.cut_off_steps.contains(&self.step) {
            return None;
        }
        Some(open_section(
            &self.inner,
            &mut state,
            name.into(),
            Some(self.step),
        ))
    }
}

impl fmt::Debug for PhaseContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PhaseContext")
            .field("name", &self.name)
            .field("remaining", &self.remaining())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Shutdown;

    #[tokio::test(start_paused = true)]
    async fn a_step_found_without_a_section_at_its_cut_off_opens_none_afterwards() {
        // The orchestrator's decision and the step's clock read can race on two threads:
        // the step may still read a time before its cut-off when the orchestrator has
        // already found no section of its open and is about to abort it. Its decision,
        // taken under the state's lock, must win.
        let shutdown = Shutdown::new(CancellationToken::new(), Duration::from_secs(10));
        let ctx = PhaseContext {
            name: "phase".to_owned(),
            deadline: Instant::now() + Duration::from_secs(9),
            cut_off: Instant::now() + Duration::from_secs(10),
            step: 7,
            inner: Arc::clone(&shutdown.inner),
            token: CancellationToken::new(),
            abandoned: Arc::default(),
        };
        drop(
            ctx.critical_section("before")
                .expect("open before the cut-off"),
        );
        let mut task = taskweave_supervise::spawn("phase", std::future::pending::<()>());
        let waited = shutdown
            .wait_while_critical(
                &mut task,
                7,
                Duration::from_secs(1),
                Instant::now() + Duration::from_secs(60),
            )
            .await;
        assert!(waited.is_none(), "no section open: cut off at once");
        assert!(
            ctx.critical_section("after").is_none(),
            "a section opened after the decision would be cut in half by the abort"
        );
        task.abort();
    }
}
