//! The sequence: `Shutdown::run`, and each step run on its own task against its grant.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskweave_supervise::TaskError;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{PhaseContext, Shutdown, Step, add, lock};
use crate::budget::grant;
use crate::{ShutdownReport, StepKind, StepReport, StepStatus, Trigger};

impl Shutdown {
    /// Triggers the shutdown with `reason` (unless it was triggered already), then
    /// [`run`](Self::run)s it.
    ///
    /// # Panics
    ///
    /// As [`run`](Self::run).
    ///
    /// # Cancel safety
    ///
    /// As [`run`](Self::run): not cancel safe.
    pub async fn run_now(&self, reason: impl Into<String>) -> ShutdownReport {
        self.trigger(reason);
        self.run().await
    }

    /// Waits for the trigger, then runs the shutdown sequence (see the type's docs) and
    /// returns its report. The report is also logged through `tracing`.
    ///
    /// # Panics
    ///
    /// Panics when called a second time (also on a clone): the sequence runs once.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropping the future in the middle of the sequence drops the step
    /// that runs (its task is stopped) and leaves the later steps unrun.
    pub async fn run(&self) -> ShutdownReport {
        self.inner.token.cancelled().await;
        let started = Instant::now();
        let (phases, resources, trigger) = {
            let mut state = lock(&self.inner.state);
            assert!(!state.ran, "Shutdown::run: the shutdown runs once");
            state.ran = true;
            state.started = Some(started);
            state.trigger.get_or_insert(Trigger::TokenCancelled);
            (
                std::mem::take(&mut state.phases),
                std::mem::take(&mut state.resources),
                state.trigger.clone().unwrap_or(Trigger::TokenCancelled),
            )
        };
        tracing::info!(%trigger, budget = ?self.inner.budget, "shutdown started");

        // 1. Readiness first, then keep serving for the delay.
        self.inner.readiness.set_not_ready();
        let delay = *lock(&self.inner.readiness_delay);
        self.begin(StepKind::Readiness, "readiness delay", delay);
        tokio::time::sleep(delay).await;
        self.finish(StepReport {
            kind: StepKind::Readiness,
            name: "readiness delay".to_string(),
            status: StepStatus::Completed,
            granted: delay,
            elapsed: Instant::now().saturating_duration_since(started),
            abandoned: Vec::new(),
        });

        // 2. The phases, sharing the budget.
        let hard_deadline = add(Instant::now(), self.inner.budget);
        // In u64: at most 2^32 weights of at most 2^32 - 1 each cannot overflow it.
        let resource_weight = u64::from(!resources.is_empty());
        let mut weights_left = phases
            .iter()
            .fold(resource_weight, |sum, phase| sum + u64::from(phase.weight));
        for phase in phases {
            let remaining = hard_deadline.saturating_duration_since(Instant::now());
            let granted = grant(remaining, phase.weight, weights_left);
            weights_left -= u64::from(phase.weight);
            self.run_step(StepKind::Phase, phase, granted, hard_deadline)
                .await;
        }

        // 3. Critical sections, until the hard deadline.
        self.wait_for_critical_sections(hard_deadline).await;

        // 4. Resources, last opened first, sharing what is left.
        let count = resources.len();
        for (closed, resource) in resources.into_iter().rev().enumerate() {
            let remaining = hard_deadline.saturating_duration_since(Instant::now());
            let left = u64::try_from(count - closed).unwrap_or(u64::MAX);
            let granted = grant(remaining, 1, left);
            self.run_step(StepKind::Resource, resource, granted, hard_deadline)
                .await;
        }

        let steps = std::mem::take(&mut lock(&self.inner.state).done);
        let report = ShutdownReport {
            trigger,
            budget: self.inner.budget,
            steps,
            elapsed: Instant::now().saturating_duration_since(started),
            complete: true,
        };
        report.log();
        report
    }

    pub(super) fn begin(&self, kind: StepKind, name: &str, granted: Duration) {
        lock(&self.inner.state).current = Some((kind, name.to_string(), granted, Instant::now()));
    }

    pub(super) fn finish(&self, step: StepReport) {
        let mut state = lock(&self.inner.state);
        state.current = None;
        state.done.push(step);
    }

    async fn run_step(
        &self,
        kind: StepKind,
        step: Step,
        granted: Duration,
        hard_deadline: Instant,
    ) {
        let Step { name, run, .. } = step;
        if granted.is_zero() {
            // The step never runs; its closure is user code, and so is its `Drop`: a panic
            // there must not stop the steps after it.
            let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(run)));
            if let Err(payload) = dropped {
                let panic = taskweave_supervise::PanicError::from_panic(name.clone(), payload);
                tracing::error!(step = %name, panic = %panic.message(), "dropping a skipped step panicked");
            }
            self.finish(StepReport {
                kind,
                name,
                status: StepStatus::Skipped,
                granted,
                elapsed: Duration::ZERO,
                abandoned: vec!["not run: no budget left".to_string()],
            });
            return;
        }
        self.begin(kind, &name, granted);
        let started = Instant::now();
        let cut_off = add(started, granted);
        // The step is told to wind down at 90 % of its grant; the rest is its time to stop
        // and report before it is cut off.
        let soft_deadline = add(started, granted.mul_f64(SOFT_SHARE));
        let token = CancellationToken::new();
        let abandoned = Arc::new(Mutex::new(Vec::new()));
        let step = {
            let mut state = lock(&self.inner.state);
            state.next_step += 1;
            state.next_step
        };
        let ctx = PhaseContext {
            name: name.clone(),
            deadline: soft_deadline,
            cut_off,
            step,
            inner: Arc::clone(&self.inner),
            token: token.clone(),
            abandoned: Arc::clone(&abandoned),
        };
        tracing::debug!(step = %name, %kind, ?granted, "shutdown step started");
        // The closure is called inside the task too: a panic in it is caught like one in
        // the future it returns.
        let mut task = taskweave_supervise::spawn(name.clone(), async move { run(ctx).await });
        let finished = tokio::select! {
            biased;
            finished = &mut task => Some(finished),
            () = tokio::time::sleep_until(soft_deadline) => {
                token.cancel();
                tokio::select! {
                    biased;
                    finished = &mut task => Some(finished),
                    () = tokio::time::sleep_until(cut_off) => None,
                }
            }
        };
        let finished = match finished {
            Some(finished) => Some(finished),
            // A critical section the step opened (through its context) is not cut in half:
            // the step is waited for while one is open, until the hard deadline.
            None => {
                let grace = granted.mul_f64(1.0 - SOFT_SHARE);
                self.wait_while_critical(&mut task, step, grace, hard_deadline)
                    .await
            }
        };
        let status = match finished {
            Some(Ok(())) => StepStatus::Completed,
            Some(Err(TaskError::Panicked(panic))) => StepStatus::Panicked(panic),
            Some(Err(_aborted)) => StepStatus::TimedOut,
            None => {
                task.abort();
                lock(&abandoned).push("cut off at its deadline".to_string());
                StepStatus::TimedOut
            }
        };
        if token.is_cancelled() && matches!(status, StepStatus::Completed) {
            // It stopped after being told to, within its grant: it overran its deadline.
            lock(&abandoned).push("finished after its deadline".to_string());
        }
        let abandoned = std::mem::take(&mut *lock(&abandoned));
        self.finish(StepReport {
            kind,
            name,
            status,
            granted,
            elapsed: Instant::now().saturating_duration_since(started),
            abandoned,
        });
    }
}

/// The share of a step's grant after which it is told to wind down.
const SOFT_SHARE: f64 = 0.9;
