//! Restarting long-lived tasks: `RestartPolicy` and `Supervisor::spawn_restarting`.

use std::collections::VecDeque;
use std::error::Error;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::catch::{display_caught, drop_caught};
use crate::supervisor::current_runtime;
use crate::{Escalation, PanicError, SpawnError, Supervisor, TaskHandle, TaskName, catch_panic};

/// How often a failed task may be restarted, and how long to wait before each restart.
///
/// At most `max_restarts` restarts within any sliding `window`; the failure after that gives
/// up and escalates. Before restart *n* (counting the restarts still inside the window), the
/// task waits `initial_backoff * 2^(n-1)`, capped at `max_backoff` (default 100 ms doubling
/// up to 5 s). As restarts leave the window the backoff shrinks again.
///
/// Like an OTP supervisor's intensity, this limits the *rate* of failures: a task whose
/// failures are spread wider than `max_restarts` per `window` (slow failures, or a
/// `max_backoff` longer than `window / max_restarts`) is restarted for ever. Choose the
/// window to cover the failure rate you consider hopeless.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_supervise::RestartPolicy;
///
/// // Like an OTP supervisor's intensity: 3 restarts per 10 s, then give up.
/// let policy = RestartPolicy::new(3, Duration::from_secs(10))
///     .with_backoff(Duration::from_millis(50), Duration::from_secs(1));
/// assert_eq!(policy.backoff(1), Duration::from_millis(50));
/// assert_eq!(policy.backoff(3), Duration::from_millis(200));
/// assert_eq!(policy.backoff(10), Duration::from_secs(1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartPolicy {
    max_restarts: u32,
    window: Duration,
    initial_backoff: Duration,
    max_backoff: Duration,
}

impl RestartPolicy {
    /// At most `max_restarts` restarts within `window`. `max_restarts == 0` never restarts:
    /// the first failure escalates.
    ///
    /// # Panics
    ///
    /// Panics if `window` is zero, which would make the limit meaningless.
    #[must_use]
    pub fn new(max_restarts: u32, window: Duration) -> Self {
        assert!(
            !window.is_zero(),
            "RestartPolicy::new: window must be greater than zero"
        );
        RestartPolicy {
            max_restarts,
            window,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }

    /// Sets the first backoff and its cap. A zero `initial` restarts at once.
    ///
    /// # Panics
    ///
    /// Panics if `max` is smaller than `initial`.
    #[must_use]
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        assert!(
            max >= initial,
            "RestartPolicy::with_backoff: max ({max:?}) must not be smaller than initial ({initial:?})"
        );
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }

    /// The most restarts allowed within one window.
    #[must_use]
    pub fn max_restarts(&self) -> u32 {
        self.max_restarts
    }

    /// The sliding window the restarts are counted in.
    #[must_use]
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The wait before the `restart`-th restart within the window (1-based).
    #[must_use]
    pub fn backoff(&self, restart: u32) -> Duration {
        let doublings = restart.saturating_sub(1).min(31);
        self.initial_backoff
            .saturating_mul(1 << doublings)
            .min(self.max_backoff)
    }
}

/// How one run of a restarting task failed.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_supervise::{Failure, RestartError, RestartPolicy, Supervisor};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let supervisor = Supervisor::new(CancellationToken::new());
/// let task = supervisor
///     .spawn_restarting("once", RestartPolicy::new(0, Duration::from_secs(1)), |_token| async {
///         Err::<(), _>("bad config")
///     })
///     .unwrap();
/// match task.await.unwrap() {
///     Err(RestartError::GaveUp { last: Failure::Error(error), restarts: 0, .. }) => {
///         assert_eq!(error, "bad config")
///     }
///     other => unreachable!("{other:?}"),
/// }
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Failure<E> {
    /// The run returned an error.
    Error(E),
    /// The run panicked (already logged with its backtrace).
    Panic(PanicError),
}

impl<E: fmt::Display> fmt::Display for Failure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Error(error) => fmt::Display::fmt(error, f),
            Failure::Panic(panic) => fmt::Display::fmt(panic, f),
        }
    }
}

// `E: Debug + Display` rather than `E: Error`, so that `anyhow::Error` works too.
impl<E: fmt::Debug + fmt::Display> Error for Failure<E> {}

/// How a restarting task ended without a successful run; see [`Failure`] for an example.
#[derive(Debug)]
#[non_exhaustive]
pub enum RestartError<E> {
    /// The task failed more often than its policy allows; the supervisor escalated.
    GaveUp {
        /// The task's name.
        name: TaskName,
        /// Restarts within the window before the final failure.
        restarts: u32,
        /// The final failure.
        last: Failure<E>,
    },
    /// The supervisor's token was cancelled while the task was failing or backing off, so it
    /// was not restarted.
    Cancelled {
        /// The task's name.
        name: TaskName,
        /// The failure that was not retried.
        last: Failure<E>,
    },
}

impl<E> RestartError<E> {
    /// The last failure.
    #[must_use]
    pub fn last_failure(&self) -> &Failure<E> {
        match self {
            RestartError::GaveUp { last, .. } | RestartError::Cancelled { last, .. } => last,
        }
    }
}

impl<E: fmt::Display> fmt::Display for RestartError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RestartError::GaveUp {
                name,
                restarts,
                last,
            } => write!(f, "task `{name}` gave up after {restarts} restarts: {last}"),
            RestartError::Cancelled { name, last } => {
                write!(
                    f,
                    "task `{name}` not restarted, supervisor stopping: {last}"
                )
            }
        }
    }
}

impl<E: fmt::Debug + fmt::Display> Error for RestartError<E> {}

impl Supervisor {
    /// Runs a long-lived task, restarting it with backoff when a run fails or panics.
    ///
    /// `make` is called with a child of the supervisor's token to start each run. A run that
    /// returns `Ok(())` ends the task (it is not restarted). A run that returns `Err` (logged
    /// at warn) or panics (logged at error with its backtrace) is restarted after the policy's
    /// backoff, unless that would exceed `max_restarts` within the window: then the task ends
    /// with [`RestartError::GaveUp`], the supervisor records an [`Escalation`] and cancels its
    /// token, stopping its other tasks too. Cancelling the token (a shutdown) stops the
    /// restarts: the task ends after the current run, or at once during a backoff.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use taskweave_supervise::{RestartPolicy, Supervisor};
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let supervisor = Supervisor::new(CancellationToken::new());
    /// let runs = Arc::new(AtomicU32::new(0));
    /// let counted = Arc::clone(&runs);
    /// let task = supervisor
    ///     .spawn_restarting("flaky", RestartPolicy::new(5, Duration::from_secs(60)), move |_token| {
    ///         let run = counted.fetch_add(1, Ordering::SeqCst);
    ///         async move {
    ///             if run < 2 { Err(format!("connection refused (run {run})")) } else { Ok(()) }
    ///         }
    ///     })
    ///     .unwrap();
    /// assert!(task.await.unwrap().is_ok());
    /// assert_eq!(runs.load(Ordering::SeqCst), 3);
    /// assert_eq!(supervisor.metrics().restarts, 2);
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`SpawnError`] with `make` when the supervisor is closed.
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    #[track_caller]
    #[allow(clippy::type_complexity)] // reason: the handle's output type is the API itself
    pub fn spawn_restarting<M, Fut, E>(
        &self,
        name: impl Into<TaskName>,
        policy: RestartPolicy,
        make: M,
    ) -> Result<TaskHandle<Result<(), RestartError<E>>>, SpawnError<M>>
    where
        M: FnMut(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let name = name.into();
        let runtime = current_runtime();
        let Some(registration) = self.register(&name) else {
            return Err(SpawnError::Closed(make));
        };
        let restart_loop = restart_loop(self.clone(), name.clone(), policy, make);
        Ok(self.launch(&runtime, name, registration, restart_loop, Result::is_err))
    }
}

async fn restart_loop<M, Fut, E>(
    supervisor: Supervisor,
    name: TaskName,
    policy: RestartPolicy,
    mut make: M,
) -> Result<(), RestartError<E>>
where
    M: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: fmt::Display,
{
    let token = supervisor.token();
    let mut recent_restarts: VecDeque<Instant> = VecDeque::new();
    loop {
        // `make` is called inside the caught future: a panic in the factory itself is a failed
        // run like any other, not the end of the restarting task.
        let run_token = token.child_token();
        // The failure is logged inside it too: the error's `Display` is user code.
        let run = catch_panic(name.clone(), async {
            let outcome = make(run_token).await;
            if let Err(error) = &outcome {
                tracing::warn!(task = %name, %error, "task failed");
            }
            outcome
        });
        let last = match run.await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(error)) => Failure::Error(error),
            Err(panic) => Failure::Panic(panic),
        };
        if token.is_cancelled() {
            return Err(RestartError::Cancelled { name, last });
        }
        let now = Instant::now();
        while recent_restarts
            .front()
            .is_some_and(|restart| now.duration_since(*restart) >= policy.window)
        {
            recent_restarts.pop_front();
        }
        let restarts = u32::try_from(recent_restarts.len()).unwrap_or(u32::MAX);
        if restarts >= policy.max_restarts {
            supervisor.escalate(Escalation {
                task: name.clone(),
                restarts,
                window: policy.window,
                last_failure: display_caught(&last),
            });
            return Err(RestartError::GaveUp {
                name,
                restarts,
                last,
            });
        }
        let delay = policy.backoff(restarts + 1);
        tracing::debug!(task = %name, restart = restarts + 1, ?delay, "restarting task");
        // A backoff too long to add to the clock (`Duration::MAX`) waits for the token
        // alone: `sleep` would add it to `Instant::now()`, which overflows.
        let until = Instant::now().checked_add(delay);
        tokio::select! {
            biased;
            () = token.cancelled() => return Err(RestartError::Cancelled { name, last }),
            () = async {
                match until {
                    Some(until) => tokio::time::sleep_until(until).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
        recent_restarts.push_back(Instant::now());
        supervisor.count_restart();
        // The failed run's error is user data: its `Drop` must not end the restart loop.
        drop_caught(&name, last);
    }
}
