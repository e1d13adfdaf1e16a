//! `Shutdown`: the orchestrator.

mod context;
mod critical;
mod run;
mod signals;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{Readiness, StepKind, StepReport, Trigger};
pub(super) use taskweave_supervise::internal::lock;

pub use context::PhaseContext;
pub use critical::CriticalSection;

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
/// A step with no time left is reported as skipped. The result is a [`ShutdownReport`](crate::ShutdownReport).
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
    /// Steps the orchestrator has decided to cut off (set under this lock when it finds no
    /// section of theirs open): a section they open afterwards is refused, even if their
    /// own clock read was still before the cut-off.
    cut_off_steps: Vec<u64>,
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

/// `at + d`, clamped instead of overflowing for absurd budgets.
fn add(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .unwrap_or_else(|| at + Duration::from_secs(100 * 365 * 24 * 3600))
}
