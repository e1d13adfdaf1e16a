//! Critical sections: opening them, closing them, and the shutdown waiting for them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use taskweave_supervise::TaskError;
use tokio::time::Instant;

use super::{Inner, Shutdown, State, add, lock};
use crate::{StepKind, StepReport, StepStatus};

/// An open critical section; see [`Shutdown::critical_section`]. It ends when dropped.
pub struct CriticalSection {
    inner: Arc<Inner>,
    id: u64,
}

impl Shutdown {
    /// Opens a critical section (a database commit, the end of a batch): the shutdown waits
    /// for it, until the hard deadline, before closing the resources. It ends when the guard
    /// is dropped. (A phase that must not be cut off in the middle of its own critical work
    /// opens it with [`PhaseContext::critical_section`](crate::PhaseContext::critical_section)
    /// instead.)
    ///
    /// Returns `None` once the shutdown is past its critical-section wait (the resources are
    /// closing): do not start the work then.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use taskweave_shutdown::Shutdown;
    /// # use tokio_util::sync::CancellationToken;
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let shutdown = Shutdown::new(CancellationToken::new(), Duration::from_secs(5));
    /// let commit = shutdown.critical_section("commit batch 42").expect("not closing yet");
    /// tokio::spawn(async move {
    ///     tokio::time::sleep(Duration::from_secs(1)).await; // the commit
    ///     drop(commit);
    /// });
    /// let report = shutdown.run_now("test").await;
    /// assert!(report.step("critical sections").unwrap().status.is_completed());
    /// # }
    /// ```
    #[must_use = "the critical section ends when the guard is dropped"]
    pub fn critical_section(&self, name: impl Into<String>) -> Option<CriticalSection> {
        let mut state = lock(&self.inner.state);
        if state.critical_closed_for_good {
            return None;
        }
        Some(open_section(&self.inner, &mut state, name.into(), None))
    }

    /// Waits for `task` while a critical section opened by the step `step` is open, until
    /// the hard deadline; once its sections are closed, for at most `grace` more. `None`
    /// when the task is still running then.
    pub(super) async fn wait_while_critical(
        &self,
        task: &mut taskweave_supervise::TaskHandle<()>,
        step: u64,
        grace: Duration,
        hard_deadline: Instant,
    ) -> Option<Result<(), TaskError>> {
        let mut waited = false;
        loop {
            let closed = self.inner.critical_closed.notified();
            let mut closed = std::pin::pin!(closed);
            closed.as_mut().enable();
            let own_open = {
                let mut state = lock(&self.inner.state);
                let own_open = state
                    .critical
                    .values()
                    .any(|(_, owner)| *owner == Some(step));
                if !own_open && !waited {
                    // Decided under the lock the step's `critical_section` takes: a section
                    // it opens from now on is refused, so none is cut in half by the abort.
                    state.cut_off_steps.push(step);
                    return None; // nothing of its own open at its cut-off
                }
                own_open
            };
            waited = true;
            if !own_open {
                // A section that just closed was likely the step's last piece of work: it
                // gets a short grace (the wind-down share of its grant) to return.
                let until = add(Instant::now(), grace).min(hard_deadline);
                return tokio::select! {
                    biased;
                    finished = &mut *task => Some(finished),
                    () = tokio::time::sleep_until(until) => None,
                };
            }
            tokio::select! {
                biased;
                finished = &mut *task => return Some(finished),
                () = closed => {}
                () = tokio::time::sleep_until(hard_deadline) => return None,
            }
        }
    }

    pub(super) async fn wait_for_critical_sections(&self, hard_deadline: Instant) {
        let started = Instant::now();
        let granted = hard_deadline.saturating_duration_since(started);
        let name = "critical sections";
        self.begin(StepKind::CriticalSections, name, granted);
        let open = loop {
            let closed = self.inner.critical_closed.notified();
            let mut closed = std::pin::pin!(closed);
            closed.as_mut().enable();
            let open: Vec<String> = {
                let mut state = lock(&self.inner.state);
                let open: Vec<String> = state
                    .critical
                    .values()
                    .map(|(name, _)| name.clone())
                    .collect();
                // Under the same lock as the check: a section opened after it (by a relay
                // starting a batch on another thread) must be refused, not missed.
                if open.is_empty() {
                    state.critical_closed_for_good = true;
                }
                open
            };
            if open.is_empty() {
                break open;
            }
            tokio::select! {
                () = closed => {}
                () = tokio::time::sleep_until(hard_deadline) => break open,
            }
        };
        // From now on the resources close: no new critical section may start.
        lock(&self.inner.state).critical_closed_for_good = true;
        let status = if open.is_empty() {
            StepStatus::Completed
        } else {
            StepStatus::TimedOut
        };
        self.finish(StepReport {
            kind: StepKind::CriticalSections,
            name: name.to_string(),
            status,
            granted,
            elapsed: Instant::now().saturating_duration_since(started),
            abandoned: open
                .into_iter()
                .map(|name| format!("still open at the hard deadline: {name}"))
                .collect(),
        });
    }
}

pub(super) fn open_section(
    inner: &Arc<Inner>,
    state: &mut State,
    name: String,
    owner: Option<u64>,
) -> CriticalSection {
    let id = state.next_critical;
    state.next_critical += 1;
    state.critical.insert(id, (name, owner));
    CriticalSection {
        inner: Arc::clone(inner),
        id,
    }
}

impl Drop for CriticalSection {
    fn drop(&mut self) {
        lock(&self.inner.state).critical.remove(&self.id);
        self.inner.critical_closed.notify_waiters();
    }
}

impl fmt::Debug for CriticalSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CriticalSection")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}
