//! `ShutdownReport`: what each step of a shutdown did, as a value, a table and log events.

use std::fmt;
use std::time::Duration;

use taskweave_supervise::PanicError;

/// What started the shutdown.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Trigger {
    /// A signal: `"SIGTERM"` or `"SIGINT"`.
    Signal(&'static str),
    /// [`Shutdown::trigger`](crate::Shutdown::trigger) from code, with its reason.
    Requested(String),
    /// The shutdown's token was cancelled by someone else.
    TokenCancelled,
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trigger::Signal(name) => f.write_str(name),
            Trigger::Requested(reason) => write!(f, "requested: {reason}"),
            Trigger::TokenCancelled => f.write_str("token cancelled"),
        }
    }
}

/// The kind of a step of the shutdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepKind {
    /// Not ready, then the readiness delay.
    Readiness,
    /// A phase registered with [`Shutdown::phase`](crate::Shutdown::phase).
    Phase,
    /// Waiting for the critical sections still open.
    CriticalSections,
    /// Closing a resource registered with [`Shutdown::resource`](crate::Shutdown::resource).
    Resource,
}

impl fmt::Display for StepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StepKind::Readiness => "readiness",
            StepKind::Phase => "phase",
            StepKind::CriticalSections => "critical",
            StepKind::Resource => "resource",
        })
    }
}

/// How a step ended.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum StepStatus {
    /// It finished within its grant.
    Completed,
    /// Its grant ran out: its token was cancelled and its task stopped; the next step ran
    /// with what was left.
    TimedOut,
    /// It panicked (caught, logged with the backtrace); the next step ran.
    Panicked(PanicError),
    /// It did not run: no budget was left.
    Skipped,
    /// It was running when a second signal made the process exit at once.
    Interrupted,
}

impl StepStatus {
    /// `true` for [`Completed`](Self::Completed).
    #[must_use]
    pub fn is_completed(&self) -> bool {
        matches!(self, StepStatus::Completed)
    }

    /// `true` for [`TimedOut`](Self::TimedOut).
    #[must_use]
    pub fn is_timed_out(&self) -> bool {
        matches!(self, StepStatus::TimedOut)
    }

    /// `true` for [`Skipped`](Self::Skipped).
    #[must_use]
    pub fn is_skipped(&self) -> bool {
        matches!(self, StepStatus::Skipped)
    }

    /// The panic, for [`Panicked`](Self::Panicked).
    #[must_use]
    pub fn panic(&self) -> Option<&PanicError> {
        match self {
            StepStatus::Panicked(panic) => Some(panic),
            _ => None,
        }
    }
}

impl fmt::Display for StepStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StepStatus::Completed => "completed",
            StepStatus::TimedOut => "timed out",
            StepStatus::Panicked(_) => "panicked",
            StepStatus::Skipped => "skipped",
            StepStatus::Interrupted => "interrupted",
        })
    }
}

/// One step of the shutdown: its status, the time it was granted and the time it took,
/// and what it abandoned.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StepReport {
    /// The step's kind.
    pub kind: StepKind,
    /// The name it was registered with.
    pub name: String,
    /// How it ended.
    pub status: StepStatus,
    /// The time it was granted (for critical sections: until the hard deadline).
    pub granted: Duration,
    /// The time it took.
    pub elapsed: Duration,
    /// What it left undone: reported by the step itself
    /// ([`PhaseContext::abandon`](crate::PhaseContext::abandon)), or noted by the
    /// orchestrator (a step cut off, critical sections still open, a resource not closed).
    pub abandoned: Vec<String>,
}

/// The result of a shutdown: per step, in the order they ran.
///
/// `Display` prints it as a table; [`log`](Self::log) sends it to `tracing`; with the
/// `json` feature, `to_json` gives it as JSON.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// What started the shutdown.
    pub trigger: Trigger,
    /// The total budget shared by the phases, critical sections and resources.
    pub budget: Duration,
    /// The steps, in the order they ran.
    pub steps: Vec<StepReport>,
    /// From the trigger to the end of the last step.
    pub elapsed: Duration,
    /// `false` when a second signal cut the shutdown short (the report printed on the way
    /// out).
    pub complete: bool,
}

impl ShutdownReport {
    /// `true` when every step completed.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.complete && self.steps.iter().all(|step| step.status.is_completed())
    }

    /// The step named `name`, if it ran.
    #[must_use]
    pub fn step(&self, name: &str) -> Option<&StepReport> {
        self.steps.iter().find(|step| step.name == name)
    }

    /// Logs the report through `tracing`: one event per step (info when it completed, warn
    /// when it timed out, was skipped or interrupted, error when it panicked), then a summary.
    pub fn log(&self) {
        for step in &self.steps {
            let abandoned = step.abandoned.join("; ");
            match &step.status {
                StepStatus::Completed => tracing::info!(
                    step = %step.name, kind = %step.kind, granted = ?step.granted,
                    took = ?step.elapsed, abandoned, "shutdown step completed"
                ),
                StepStatus::Panicked(panic) => tracing::error!(
                    step = %step.name, kind = %step.kind, granted = ?step.granted,
                    took = ?step.elapsed, panic = %panic.message(), abandoned,
                    "shutdown step panicked"
                ),
                status => tracing::warn!(
                    step = %step.name, kind = %step.kind, %status, granted = ?step.granted,
                    took = ?step.elapsed, abandoned, "shutdown step did not complete"
                ),
            }
        }
        tracing::info!(
            trigger = %self.trigger, budget = ?self.budget, took = ?self.elapsed,
            clean = self.is_clean(), complete = self.complete, "shutdown finished"
        );
    }

    /// The report as a JSON object (durations in milliseconds).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use taskweave_shutdown::Shutdown;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// let shutdown = Shutdown::new(CancellationToken::new(), Duration::from_secs(5));
    /// shutdown.phase("flush", |_ctx| async {});
    /// let report = shutdown.run_now("test").await;
    /// let json = report.to_json();
    /// assert!(json.contains(r#""name":"flush""#), "{json}");
    /// assert!(json.contains(r#""status":"completed""#), "{json}");
    /// # }
    /// ```
    #[cfg(feature = "json")]
    #[cfg_attr(docsrs, doc(cfg(feature = "json")))]
    #[must_use]
    pub fn to_json(&self) -> String {
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let steps: Vec<serde_json::Value> = self
            .steps
            .iter()
            .map(|step| {
                serde_json::json!({
                    "kind": step.kind.to_string(),
                    "name": step.name,
                    "status": step.status.to_string(),
                    "panic": match &step.status {
                        StepStatus::Panicked(panic) => Some(panic.message().to_string()),
                        _ => None,
                    },
                    "granted_ms": millis(step.granted),
                    "elapsed_ms": millis(step.elapsed),
                    "abandoned": step.abandoned,
                })
            })
            .collect();
        serde_json::json!({
            "trigger": self.trigger.to_string(),
            "budget_ms": millis(self.budget),
            "elapsed_ms": millis(self.elapsed),
            "complete": self.complete,
            "clean": self.is_clean(),
            "steps": steps,
        })
        .to_string()
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

impl fmt::Display for ShutdownReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "shutdown ({}): {} in {} of a {} budget{}",
            self.trigger,
            if self.is_clean() {
                "clean"
            } else {
                "NOT clean"
            },
            seconds(self.elapsed),
            seconds(self.budget),
            if self.complete {
                ""
            } else {
                ", cut short by a second signal"
            },
        )?;
        let width = self
            .steps
            .iter()
            .map(|step| step.name.chars().count())
            .max()
            .unwrap_or(4)
            .max(4);
        writeln!(
            f,
            " #  {:<width$}  {:<9}  {:<11}  {:>9}  {:>9}  abandoned",
            "step", "kind", "status", "granted", "took"
        )?;
        for (i, step) in self.steps.iter().enumerate() {
            let abandoned = if step.abandoned.is_empty() {
                "-".to_string()
            } else {
                step.abandoned.join("; ")
            };
            writeln!(
                f,
                "{:>2}  {:<width$}  {:<9}  {:<11}  {:>9}  {:>9}  {}",
                i + 1,
                step.name,
                step.kind.to_string(),
                step.status.to_string(),
                seconds(step.granted),
                seconds(step.elapsed),
                abandoned,
            )?;
            if let StepStatus::Panicked(panic) = &step.status {
                writeln!(f, "    panic: {}", panic.message())?;
            }
        }
        Ok(())
    }
}
