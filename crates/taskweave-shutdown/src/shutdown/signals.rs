//! Signals: the first SIGINT or SIGTERM triggers the shutdown, a second exits with the report
//! so far.

use std::time::Duration;

use tokio::time::Instant;

use super::{Shutdown, lock};
use crate::{ShutdownReport, StepReport, StepStatus, Trigger};

impl Shutdown {
    /// Listens for SIGINT and SIGTERM (Ctrl-C elsewhere than on Unix) on a task of its own,
    /// which lives until the runtime shuts down: the first signal triggers the shutdown (or
    /// is logged, when it was triggered already from code); the second prints the report so
    /// far to stderr, logs it, and exits the process at once with code 130 (SIGINT) or 143
    /// (SIGTERM). Calling it again after it succeeded does nothing; after an error it tries
    /// again.
    ///
    /// # Errors
    ///
    /// The error of registering the signal handlers.
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    pub fn listen_for_signals(&self) -> std::io::Result<()> {
        {
            let mut state = lock(&self.inner.state);
            if state.listening {
                return Ok(());
            }
            state.listening = true;
        }
        let me = self.clone();
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            // A registration that fails leaves nobody listening: a later call tries again.
            let registered = signal(SignalKind::terminate())
                .and_then(|terminate| Ok((terminate, signal(SignalKind::interrupt())?)));
            let (mut terminate, mut interrupt) = match registered {
                Ok(both) => both,
                Err(error) => {
                    lock(&self.inner.state).listening = false;
                    return Err(error);
                }
            };
            drop(taskweave_supervise::spawn("shutdown-signals", async move {
                loop {
                    let (name, code) = tokio::select! {
                        Some(()) = terminate.recv() => ("SIGTERM", 143),
                        Some(()) = interrupt.recv() => ("SIGINT", 130),
                        else => return, // the signal driver is gone
                    };
                    me.on_signal(name, code);
                }
            }));
        }
        #[cfg(not(unix))]
        {
            drop(taskweave_supervise::spawn("shutdown-signals", async move {
                while tokio::signal::ctrl_c().await.is_ok() {
                    me.on_signal("SIGINT", 130);
                }
            }));
        }
        Ok(())
    }

    fn on_signal(&self, name: &'static str, code: i32) {
        let first = {
            let mut state = lock(&self.inner.state);
            state.signals += 1;
            state.signals == 1
        };
        if first {
            if self.start(Trigger::Signal(name)) {
                tracing::info!(
                    signal = name,
                    "shutdown triggered; a second signal exits at once"
                );
            } else {
                tracing::info!(
                    signal = name,
                    "already shutting down; a second signal exits at once"
                );
            }
            return;
        }
        let report = self.report_so_far();
        report.log();
        eprintln!("{name} during the shutdown: exiting now with code {code}\n{report}");
        std::process::exit(code);
    }

    /// The report so far: the steps that finished, and the one running as interrupted.
    #[must_use]
    pub fn report_so_far(&self) -> ShutdownReport {
        let state = lock(&self.inner.state);
        let now = Instant::now();
        let mut steps = state.done.clone();
        if let Some((kind, name, granted, started)) = &state.current {
            steps.push(StepReport {
                kind: *kind,
                name: name.clone(),
                status: StepStatus::Interrupted,
                granted: *granted,
                elapsed: now.saturating_duration_since(*started),
                abandoned: Vec::new(),
            });
        }
        ShutdownReport {
            trigger: state.trigger.clone().unwrap_or(Trigger::TokenCancelled),
            budget: self.inner.budget,
            steps,
            elapsed: state.started.map_or(Duration::ZERO, |started| {
                now.saturating_duration_since(started)
            }),
            complete: false,
        }
    }
}
