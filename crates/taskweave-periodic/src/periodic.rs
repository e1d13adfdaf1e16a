//! `Periodic`: the runner itself, its settings and its loop.

use std::future::Future;
use std::time::Duration;

use taskweave_supervise::{TaskHandle, TaskName, catch_panic};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::schedule::{add, next_start};
use crate::{FirstRun, MissedTicks, PeriodicReport, RunOutcome, Schedule};

/// Runs a job every period until its token is cancelled.
///
/// Guarantees, each one a pitfall of a hand-written `interval` loop:
///
/// - **No bursts.** Ticks missed while a run was still going are skipped or delayed
///   ([`MissedTicks`]), never replayed back to back (tokio's `interval` bursts by default).
/// - **No overlap.** The next run starts only after the previous one ended.
/// - **Bounded runs.** With [`with_timeout`](Self::with_timeout) a run that takes too long is
///   cut short: its future is dropped (so it stops at its current `.await`) and its token
///   cancelled (so tasks it handed the token to stop too), and the schedule goes on. There is
///   no default timeout: no bound is right for every job, so choose one for yours.
/// - **Isolation.** A run that returns an error is logged at warn; a run that panics is
///   caught and logged at error with its backtrace (through
///   [`taskweave_supervise::catch_panic`]). Both are counted and the schedule goes on.
/// - **A chosen first run**: [`FirstRun::AfterPeriod`] (the default) or
///   [`FirstRun::Immediately`].
/// - **Fixed rate or fixed gap** ([`Schedule`]), with optional [jitter](Self::with_jitter).
/// - **A report** of what happened, when the token stops it.
///
/// Each run gets a child of the runner's token, so a run sees the runner's cancellation (and
/// its own timeout). When the token is cancelled during a run, that run is awaited (bounded
/// by the timeout, if one is set) and the runner returns: a run is never dropped halfway
/// because of a shutdown, only because of its own timeout.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_periodic::{FirstRun, Periodic};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let token = CancellationToken::new();
/// let runner = Periodic::new(Duration::from_secs(1))
///     .with_name("cleaner")
///     .with_first_run(FirstRun::Immediately)
///     .with_timeout(Duration::from_millis(500))
///     .spawn(token.clone(), |_run_token| async {
///         // Delete expired rows here; an `Err` is logged and counted.
///         Ok::<(), std::io::Error>(())
///     });
///
/// tokio::time::sleep(Duration::from_millis(3500)).await;
/// token.cancel();
/// let report = runner.await.unwrap();
/// assert_eq!(report.runs, 4); // at 0 s, 1 s, 2 s and 3 s
/// assert_eq!(report.succeeded, 4);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Periodic {
    name: TaskName,
    period: Duration,
    first_run: FirstRun,
    missed_ticks: MissedTicks,
    schedule: Schedule,
    timeout: Option<Duration>,
    jitter: Duration,
    seed: Option<u64>,
}

impl Periodic {
    /// A runner with the given period, first run after one period, missed ticks skipped,
    /// fixed rate, no timeout, no jitter, named `"periodic"`.
    ///
    /// # Panics
    ///
    /// Panics if `period` is zero.
    #[must_use]
    pub fn new(period: Duration) -> Self {
        assert!(
            !period.is_zero(),
            "Periodic::new: period must be greater than zero"
        );
        Periodic {
            name: TaskName::from("periodic"),
            period,
            first_run: FirstRun::default(),
            missed_ticks: MissedTicks::default(),
            schedule: Schedule::default(),
            timeout: None,
            jitter: Duration::ZERO,
            seed: None,
        }
    }

    /// Names the runner in logs, panics and its spawned task.
    #[must_use]
    pub fn with_name(mut self, name: impl Into<TaskName>) -> Self {
        self.name = name.into();
        self
    }

    /// Chooses when the first run happens.
    #[must_use]
    pub fn with_first_run(mut self, first_run: FirstRun) -> Self {
        self.first_run = first_run;
        self
    }

    /// Chooses what happens to ticks missed during a long run (fixed rate only).
    #[must_use]
    pub fn with_missed_ticks(mut self, missed_ticks: MissedTicks) -> Self {
        self.missed_ticks = missed_ticks;
        self
    }

    /// Chooses fixed-rate or fixed-gap scheduling.
    #[must_use]
    pub fn with_schedule(mut self, schedule: Schedule) -> Self {
        self.schedule = schedule;
        self
    }

    /// Bounds every run: a run still going after `timeout` has its token cancelled and its
    /// future dropped, and is counted as timed out (as panicked if dropping it panicked; its
    /// token is cancelled all the same, as after any panicked run).
    ///
    /// # Panics
    ///
    /// Panics if `timeout` is zero.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        assert!(
            !timeout.is_zero(),
            "Periodic::with_timeout: timeout must be greater than zero"
        );
        self.timeout = Some(timeout);
        self
    }

    /// Delays each start, the first one included, by a random amount in `0..=jitter`, so that
    /// many instances started together (a deploy) do not hit a shared resource in step. The
    /// jitter never accumulates: the grid (or the gap) is measured without it.
    ///
    /// # Panics
    ///
    /// Panics if `jitter` is not smaller than the period: starts could then swap places with
    /// the next tick.
    #[must_use]
    pub fn with_jitter(mut self, jitter: Duration) -> Self {
        assert!(
            jitter < self.period,
            "Periodic::with_jitter: jitter ({jitter:?}) must be smaller than the period ({:?})",
            self.period
        );
        self.jitter = jitter;
        self
    }

    /// Seeds the jitter's random numbers, for a schedule that repeats exactly (tests, replays).
    #[must_use]
    pub fn with_jitter_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The runner's name.
    #[must_use]
    pub fn name(&self) -> &TaskName {
        &self.name
    }

    /// The period.
    #[must_use]
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Runs `job` on schedule until `token` is cancelled, then returns what happened.
    ///
    /// `job` is called with a child of `token` for each run. Runs happen in the caller's task;
    /// use [`spawn`](Self::spawn) to run them on a task of their own.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskweave_periodic::Periodic;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let token = CancellationToken::new();
    /// let stop = token.clone();
    /// tokio::spawn(async move {
    ///     tokio::time::sleep(Duration::from_millis(350)).await;
    ///     stop.cancel();
    /// });
    /// let mut flushed = 0;
    /// let report = Periodic::new(Duration::from_millis(100))
    ///     .run(token, |_run_token| {
    ///         flushed += 1;
    ///         async {}
    ///     })
    ///     .await;
    /// assert_eq!((report.runs, flushed), (3, 3)); // at 100, 200 and 300 ms
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops the runner at once, dropping a run in progress, and loses the
    /// report. Cancel the token instead to stop after the current run with a report.
    pub async fn run<J, Fut>(self, token: CancellationToken, mut job: J) -> PeriodicReport
    where
        J: FnMut(CancellationToken) -> Fut,
        Fut: Future,
        Fut::Output: RunOutcome,
    {
        let mut report = PeriodicReport::default();
        let mut rng = self
            .seed
            .map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
        let origin = Instant::now();
        let mut scheduled = match self.first_run {
            FirstRun::Immediately => origin,
            FirstRun::AfterPeriod => add(origin, self.period),
        };
        tracing::debug!(runner = %self.name, period = ?self.period, "periodic runner started");
        loop {
            let start_at = add(scheduled, self.jitter_sample(&mut rng));
            tokio::select! {
                biased;
                () = token.cancelled() => break,
                () = tokio::time::sleep_until(start_at) => {}
            }
            report.runs += 1;
            self.run_once(&token, &mut job, &mut report).await;
            let next = next_start(
                self.schedule,
                self.missed_ticks,
                self.period,
                scheduled,
                Instant::now(),
            );
            if next.skipped > 0 {
                tracing::debug!(runner = %self.name, skipped = next.skipped, "run overran; ticks skipped");
            }
            report.skipped_ticks += next.skipped;
            scheduled = next.at;
        }
        tracing::debug!(runner = %self.name, %report, "periodic runner stopped");
        report
    }

    /// Spawns [`run`](Self::run) on its own task (through [`taskweave_supervise::spawn`], so
    /// even a panic outside a run would be caught) and returns its handle; awaiting the handle
    /// yields the report once `token` is cancelled.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskweave_periodic::Periodic;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let token = CancellationToken::new();
    /// let heartbeat = Periodic::new(Duration::from_secs(1))
    ///     .with_name("heartbeat")
    ///     .spawn(token.clone(), |_run_token| async {});
    /// assert_eq!(heartbeat.name(), "heartbeat");
    /// tokio::time::sleep(Duration::from_millis(2500)).await;
    /// token.cancel();
    /// assert_eq!(heartbeat.await.unwrap().runs, 2);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    #[track_caller]
    pub fn spawn<J, Fut>(self, token: CancellationToken, job: J) -> TaskHandle<PeriodicReport>
    where
        J: FnMut(CancellationToken) -> Fut + Send + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: RunOutcome,
    {
        let name = self.name.clone();
        taskweave_supervise::spawn(name, self.run(token, job))
    }

    async fn run_once<J, Fut>(
        &self,
        token: &CancellationToken,
        job: &mut J,
        report: &mut PeriodicReport,
    ) where
        J: FnMut(CancellationToken) -> Fut,
        Fut: Future,
        Fut::Output: RunOutcome,
    {
        let run_token = token.child_token();
        // Everything that runs user code happens inside the caught future: calling the job
        // (a panic in the closure itself is isolated too), dropping its future when the
        // timeout fires, formatting a failure, and dropping the outcome. A panic in any of
        // them is a panicked run, and the schedule goes on.
        let job_token = run_token.clone();
        let limit = self.timeout;
        let name = &self.name;
        let run = catch_panic(self.name.clone(), async move {
            let outcome = match limit {
                None => job(job_token).await,
                Some(limit) => match tokio::time::timeout(limit, job(job_token)).await {
                    Ok(outcome) => outcome,
                    Err(_elapsed) => return Ran::TimedOut(limit),
                },
            };
            match outcome.failure() {
                Some(error) => {
                    tracing::warn!(runner = %name, %error, "periodic run failed");
                    Ran::Failed
                }
                None => Ran::Succeeded,
            }
        });
        match run.await {
            // Already logged with its backtrace by `catch_panic`. The run's token is
            // cancelled too: the panic may have come from dropping a timed-out run's future,
            // whose helpers must stop as after any timeout.
            Err(_panic) => {
                run_token.cancel();
                report.panicked += 1;
            }
            Ok(Ran::Succeeded) => report.succeeded += 1,
            Ok(Ran::Failed) => report.failed += 1,
            Ok(Ran::TimedOut(limit)) => {
                run_token.cancel();
                report.timed_out += 1;
                tracing::warn!(runner = %self.name, timeout = ?limit, "periodic run timed out");
            }
        }
    }

    fn jitter_sample(&self, rng: &mut fastrand::Rng) -> Duration {
        if self.jitter.is_zero() {
            return Duration::ZERO;
        }
        let max = u64::try_from(self.jitter.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rng.u64(0..=max))
    }
}

/// How one run ended, decided inside the caught future.
enum Ran {
    Succeeded,
    Failed,
    TimedOut(Duration),
}
