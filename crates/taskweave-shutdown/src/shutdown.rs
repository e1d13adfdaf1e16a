//! `Shutdown`: the orchestrator.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use taskweave_supervise::TaskError;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::budget::grant;
use crate::{Readiness, ShutdownReport, StepKind, StepReport, StepStatus, Trigger};

type StepFuture = Pin<Box<dyn Future<Output = ()> + Send>>;
type StepFn = Box<dyn FnOnce(PhaseContext) -> StepFuture + Send>;

struct Step {
    name: String,
    weight: u32,
    run: StepFn,
}

/// Whole-application graceful shutdown: one trigger, readiness first, ordered phases sharing
/// one budget, critical sections waited for, resources closed in reverse order, a report.
///
/// Cheap to clone: every clone is the same orchestrator, so components can register their
/// phases, resources and critical sections wherever they are built.
///
/// # The sequence
///
/// [`run`](Self::run) waits for the trigger (the token cancelled: a first SIGINT or SIGTERM
/// once [`listen_for_signals`](Self::listen_for_signals) was called, a call to
/// [`trigger`](Self::trigger), or anyone cancelling the token), then:
///
/// 1. **Readiness**: [`readiness`](Self::readiness) flips to not-ready, and the service keeps
///    serving for the readiness delay ([`with_readiness_delay`](Self::with_readiness_delay)),
///    so that load balancers stop sending traffic before the drain starts. The delay comes
///    before the budget, not out of it.
/// 2. **Phases**, in the order they were registered, one at a time. Each gets a deadline: its
///    weight's share of the budget still left (resources, when any are registered, count as
///    one more share of weight 1), so time a phase does not use rolls forward to the next.
///    90 % into its grant (its [`PhaseContext::deadline`]) its token is cancelled; at the end
///    of the grant its task is stopped (unless it holds a critical section opened with
///    [`PhaseContext::critical_section`]: then it is waited for until the hard deadline),
///    and it is reported as timed out. The next phase
///    runs with what is left. A panic is caught and reported; the next phase runs.
/// 3. **Critical sections** still open ([`critical_section`](Self::critical_section)) are
///    waited for, until the hard deadline (the end of the budget): never dropped halfway.
/// 4. **Resources** ([`resource`](Self::resource)) close in reverse order of registration,
///    last of all, sharing what is left equally.
///
/// A step with no time left is reported as skipped. The result is a [`ShutdownReport`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_shutdown::Shutdown;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let shutdown = Shutdown::new(CancellationToken::new(), Duration::from_secs(10))
///     .with_readiness_delay(Duration::from_secs(2));
/// shutdown.resource("database pool", |_ctx| async { /* pool.close().await */ });
/// shutdown.phase("http drain", |_ctx| async { /* server.graceful_shutdown().await */ });
/// shutdown.phase("workers", |ctx| async move {
///     // pool.close_within(ctx.remaining()).await, reporting what it handed back:
///     ctx.abandon("3 queued jobs handed back");
/// });
///
/// shutdown.trigger("deploy");
/// let report = shutdown.run().await;
/// assert!(report.is_clean());
/// let names: Vec<&str> = report.steps.iter().map(|s| s.name.as_str()).collect();
/// assert_eq!(names, ["readiness delay", "http drain", "workers", "critical sections", "database pool"]);
/// println!("{report}"); // a table: status, granted, took, abandoned per step
/// # }
/// ```
#[derive(Clone)]
pub struct Shutdown {
    inner: Arc<Inner>,
}

struct Inner {
    token: CancellationToken,
    budget: Duration,
    readiness_delay: Mutex<Duration>,
    readiness: Readiness,
    state: Mutex<State>,
    critical_closed: Notify,
}

#[derive(Default)]
struct State {
    trigger: Option<Trigger>,
    phases: Vec<Step>,
    resources: Vec<Step>,
    // Open sections: name, and the step that opened it (through its `PhaseContext`).
    critical: BTreeMap<u64, (String, Option<u64>)>,
    next_critical: u64,
    next_step: u64,
    critical_closed_for_good: bool,
    listening: bool,
    signals: u32,
    ran: bool,
    // Progress, for the report printed when a second signal cuts the shutdown short.
    started: Option<Instant>,
    done: Vec<StepReport>,
    current: Option<(StepKind, String, Duration, Instant)>,
}

impl Shutdown {
    /// An orchestrator whose trigger is `token` (cancel it, or call
    /// [`trigger`](Self::trigger), to start the shutdown) and whose phases, critical sections
    /// and resources share `budget`.
    ///
    /// `token` is the application's root token: components that must keep serving during the
    /// readiness delay and the phases before theirs should not stop on it, but on tokens of
    /// their own that their phase cancels.
    ///
    /// # Panics
    ///
    /// Panics if `budget` is zero.
    #[must_use]
    pub fn new(token: CancellationToken, budget: Duration) -> Self {
        assert!(
            !budget.is_zero(),
            "Shutdown::new: the budget must be greater than zero"
        );
        Shutdown {
            inner: Arc::new(Inner {
                token,
                budget,
                readiness_delay: Mutex::new(Duration::ZERO),
                readiness: Readiness::new(true),
                state: Mutex::new(State::default()),
                critical_closed: Notify::new(),
            }),
        }
    }

    /// Keeps serving for `delay` after readiness flips to not-ready, before the first phase
    /// (default: none). Under Kubernetes, use either this or a `preStop` sleep.
    #[must_use]
    pub fn with_readiness_delay(self, delay: Duration) -> Self {
        *lock(&self.inner.readiness_delay) = delay;
        self
    }

    /// The root token: cancelled when the shutdown is triggered.
    #[must_use]
    pub fn token(&self) -> &CancellationToken {
        &self.inner.token
    }

    /// The total budget.
    #[must_use]
    pub fn budget(&self) -> Duration {
        self.inner.budget
    }

    /// The readiness flag; it starts ready and flips to not-ready when the shutdown starts.
    #[must_use]
    pub fn readiness(&self) -> Readiness {
        self.inner.readiness.clone()
    }

    /// Starts the shutdown from code (a fatal error in a component), the same way as a
    /// signal. Returns `false` (and changes nothing) when it had started already.
    pub fn trigger(&self, reason: impl Into<String>) -> bool {
        self.start(Trigger::Requested(reason.into()))
    }

    /// `true` once the shutdown was triggered.
    #[must_use]
    pub fn is_triggered(&self) -> bool {
        self.inner.token.is_cancelled()
    }

    fn start(&self, trigger: Trigger) -> bool {
        let mut state = lock(&self.inner.state);
        if state.trigger.is_some() || self.inner.token.is_cancelled() {
            state.trigger.get_or_insert(Trigger::TokenCancelled);
            return false;
        }
        state.trigger = Some(trigger);
        drop(state);
        // Not ready at once, even before `run` is polled.
        self.inner.readiness.set_not_ready();
        self.inner.token.cancel();
        true
    }

    /// Registers a phase, run after the phases registered before it, with weight 1.
    ///
    /// `f` gets a [`PhaseContext`] with the phase's deadline and a token cancelled when the
    /// deadline passes; it runs on its own task, so a panic is caught and reported.
    ///
    /// Returns `false` (and drops `f`) when [`run`](Self::run) has started the sequence
    /// already: a phase must be registered before that.
    pub fn phase<F, Fut>(&self, name: impl Into<String>, f: F) -> bool
    where
        F: FnOnce(PhaseContext) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.phase_weighted(name, 1, f)
    }

    /// Registers a phase with a weight: it is granted `weight` shares of the budget left
    /// when it starts, where every phase still to run holds its own shares (and the
    /// resources, together, one share).
    ///
    /// # Panics
    ///
    /// Panics if `weight` is zero.
    pub fn phase_weighted<F, Fut>(&self, name: impl Into<String>, weight: u32, f: F) -> bool
    where
        F: FnOnce(PhaseContext) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        assert!(
            weight > 0,
            "Shutdown::phase_weighted: the weight must be greater than zero"
        );
        self.register(StepKind::Phase, name.into(), weight, f)
    }

    /// Registers a resource to close at the very end, after every phase and critical
    /// section, in reverse order of registration (register as you open: the last opened
    /// closes first).
    ///
    /// Returns `false` (and drops `close`) when the shutdown has started already.
    pub fn resource<F, Fut>(&self, name: impl Into<String>, close: F) -> bool
    where
        F: FnOnce(PhaseContext) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.register(StepKind::Resource, name.into(), 1, close)
    }

    /// Adds a phase or a resource, unless the sequence has started.
    fn register<F, Fut>(&self, kind: StepKind, name: String, weight: u32, f: F) -> bool
    where
        F: FnOnce(PhaseContext) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut state = lock(&self.inner.state);
        if state.started.is_some() {
            tracing::warn!(step = %name, %kind, "registered after the shutdown started: ignored");
            return false;
        }
        let step = Step {
            name,
            weight,
            run: Box::new(move |ctx| Box::pin(f(ctx))),
        };
        match kind {
            StepKind::Resource => state.resources.push(step),
            _ => state.phases.push(step),
        }
        true
    }

    /// Opens a critical section (a database commit, the end of a batch): the shutdown waits
    /// for it, until the hard deadline, before closing the resources. It ends when the guard
    /// is dropped. (A phase that must not be cut off in the middle of its own critical work
    /// opens it with [`PhaseContext::critical_section`] instead.)
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

    /// Listens for SIGINT and SIGTERM (Ctrl-C elsewhere than on Unix) on a task of its own,
    /// which lives until the runtime shuts down: the first signal triggers the shutdown (or
    /// is logged, when it was triggered already from code); the second prints the report so
    /// far to stderr, logs it, and exits the process at once with code 130 (SIGINT) or 143
    /// (SIGTERM). Calling it again does nothing.
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
            let mut terminate = signal(SignalKind::terminate())?;
            let mut interrupt = signal(SignalKind::interrupt())?;
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

    fn begin(&self, kind: StepKind, name: &str, granted: Duration) {
        lock(&self.inner.state).current = Some((kind, name.to_string(), granted, Instant::now()));
    }

    fn finish(&self, step: StepReport) {
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

    /// Waits for `task` while a critical section opened by the step `step` is open, until
    /// the hard deadline; once its sections are closed, for at most `grace` more. `None`
    /// when the task is still running then.
    async fn wait_while_critical(
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
            let own_open = lock(&self.inner.state)
                .critical
                .values()
                .any(|(_, owner)| *owner == Some(step));
            if !own_open && !waited {
                return None; // nothing of its own open at its cut-off
            }
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

    async fn wait_for_critical_sections(&self, hard_deadline: Instant) {
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

impl fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = lock(&self.inner.state);
        f.debug_struct("Shutdown")
            .field("budget", &self.inner.budget)
            .field("trigger", &state.trigger)
            .field("phases", &state.phases.len())
            .field("resources", &state.resources.len())
            .field("critical_sections", &state.critical.len())
            .finish_non_exhaustive()
    }
}

/// A phase's (or a resource's) view of the shutdown: its deadline, a token cancelled when
/// the deadline passes, and a place to report what it abandoned.
pub struct PhaseContext {
    name: String,
    deadline: Instant,
    cut_off: Instant,
    step: u64,
    inner: Arc<Inner>,
    token: CancellationToken,
    abandoned: Arc<Mutex<Vec<String>>>,
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
    /// [`Shutdown::critical_section`] (by components) do not hold a step back.
    ///
    /// Returns `None` once the step is past the end of its grant, or the resources are
    /// closing: do not start the work then.
    #[must_use = "the critical section ends when the guard is dropped"]
    pub fn critical_section(&self, name: impl Into<String>) -> Option<CriticalSection> {
        if Instant::now() >= self.cut_off {
            return None;
        }
        let mut state = lock(&self.inner.state);
        if state.critical_closed_for_good {
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

fn open_section(
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

impl fmt::Debug for PhaseContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PhaseContext")
            .field("name", &self.name)
            .field("remaining", &self.remaining())
            .finish_non_exhaustive()
    }
}

/// An open critical section; see [`Shutdown::critical_section`]. It ends when dropped.
pub struct CriticalSection {
    inner: Arc<Inner>,
    id: u64,
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

/// The share of a step's grant after which it is told to wind down.
const SOFT_SHARE: f64 = 0.9;

/// `at + d`, clamped instead of overflowing for absurd budgets.
fn add(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .unwrap_or_else(|| at + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// Locks, ignoring poisoning: the state stays consistent (every update is one assignment).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
