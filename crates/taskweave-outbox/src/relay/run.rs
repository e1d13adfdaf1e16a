//! The relay's loop: `run` and `drain` claim batch after batch until the token, the
//! deadline or the shutdown stops them, wait adaptively between polls, and read the
//! store's counts on a task of their own.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::metrics::Counters;
use super::{CLAIM_SHARE, Relay, RelayReport, StopReason};
use crate::error::StoreError;
use crate::publish::Publisher;
use crate::store::Store;

/// Stalled batches in a row (nothing delivered, every failure retriable) after which the
/// relay asks the publisher to recover.
const STALLED_BEFORE_RECOVERY: u32 = 3;

/// The least time between two recoveries of the publisher.
const RECOVERY_EVERY: Duration = Duration::from_secs(30);

/// The longest time between two [`Store::release_held_back`] calls.
const RELEASE_EVERY: Duration = Duration::from_secs(1);

/// How long the relay's report at stop waits for the store's counts.
const REPORT_STATS_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the relay's stats reader waits for the store's counts.
const READ_STATS_TIMEOUT: Duration = Duration::from_secs(10);

impl<S: Store, P: Publisher> Relay<S, P> {
    /// Relays until `token` is cancelled; the batch in flight then finishes, and no new one
    /// starts. Then it counts what it left ([`RelayReport::left`]) for up to two seconds.
    ///
    /// Store failures and retriable or permanent publish failures never end the relay: they
    /// are counted, logged at warn, and retried after the poll interval (a permanent one
    /// parks its event). A publisher that reports itself failed for good (a fatal error,
    /// such as a Kafka producer fenced by a newer one) ends it with
    /// [`StopReason::PublisherFailed`], so that it can be restarted with a new publisher.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future (aborting its task) drops the batch in flight: nothing is lost,
    /// the store rolls it back, and what it had published is published again. Cancel the
    /// token instead to let the batch finish.
    pub async fn run(self, token: CancellationToken) -> RelayReport {
        self.relay(token, None).await
    }

    /// Relays until nothing is left to claim, `token` is cancelled, or `deadline` is too
    /// close for another batch: a batch starts only if its whole budget fits before
    /// `deadline`, and every wait on the store between batches is bounded, so it returns by
    /// `deadline` (give or take the scheduler) whatever the store does. It counts what it
    /// left only in the time left before `deadline` (at most two seconds); otherwise
    /// [`RelayReport::left`] is `None`. For a shutdown phase that publishes what this
    /// instance wrote before it exits: `relay.drain(ctx.token().clone(), ctx.deadline())`.
    ///
    /// # Cancel safety
    ///
    /// As [`run`](Self::run).
    pub async fn drain(self, token: CancellationToken, deadline: Instant) -> RelayReport {
        self.relay(token, Some(deadline)).await
    }

    async fn relay(self, token: CancellationToken, drain_until: Option<Instant>) -> RelayReport {
        let mut listener = self.store.nudge().listen();
        let wake_ups_token = token.child_token();
        // Cancels the listener however this future ends, an abort of its task included.
        let _stop_wake_ups = wake_ups_token.clone().drop_guard();
        let wake_ups = self
            .store
            .wake_ups(wake_ups_token.clone())
            .map(|listen| taskweave_supervise::spawn(format!("{}: listener", self.name), listen));
        // The store's counts, read on a task of its own so a slow count never holds a batch.
        let stats_reader = self.stats_interval.map(|every| {
            let (store, counters, name) = (
                Arc::clone(&self.store),
                Arc::clone(&self.counters),
                self.name.clone(),
            );
            let token = wake_ups_token.clone();
            taskweave_supervise::spawn(format!("{}: stats", self.name), async move {
                // Raced against the stop, so that a slow count never holds the relay's end
                // (it waits for this task).
                token
                    .run_until_cancelled(async {
                        loop {
                            read_stats(&*store, &counters, &name).await;
                            tokio::time::sleep(every).await;
                        }
                    })
                    .await;
            })
        });
        let mut report = RelayReport::new(self.name.clone());
        let min_poll = self.min_poll_interval.min(self.poll_interval);
        // The next idle wait: short after work, doubling while idle.
        let mut idle_wait = self.poll_interval;
        let mut stalled = 0_u32;
        let mut last_recovery: Option<Instant> = None;
        let mut release_due = Instant::now();
        let mut released_last = 0_u64;
        tracing::debug!(relay = %self.name, "outbox relay started");
        let stopped = loop {
            if token.is_cancelled() {
                break StopReason::Cancelled;
            }
            if let Some(deadline) = drain_until {
                let remaining = deadline.saturating_duration_since(Instant::now());
                if remaining < self.batch_budget {
                    break StopReason::DeadlineTooClose { remaining };
                }
            }
            let section = match &self.shutdown {
                Some(shutdown) => {
                    match shutdown.critical_section(format!("{}: batch", self.name)) {
                        Some(section) => Some(section),
                        None => break StopReason::ShutdownClosing,
                    }
                }
                None => None,
            };
            listener.mark_seen();
            let outcome = self.batch().await;
            drop(section);
            if token.is_cancelled() && outcome.as_ref().is_ok_and(|s| s.claimed > 0) {
                report.finished_batch_after_cancel = true;
            }
            let recovered = outcome.as_ref().map_or(0, |summary| summary.recovered);
            let wait: Option<Duration> = match outcome {
                Ok(summary) => {
                    report.add(&summary);
                    // Empty polls between backoffs neither count nor reset: only a delivery does.
                    if summary.dispatched > 0 {
                        stalled = 0;
                    } else if summary.stalled {
                        stalled += 1;
                    }
                    let fatal = summary.fatal.clone();
                    let stuck =
                        (summary.failed > 0 || summary.commit_failed) && summary.dispatched == 0;
                    let empty = summary.claimed == 0;
                    report.last_batch = Some(summary);
                    if let Some(message) = fatal {
                        tracing::error!(relay = %self.name, error = %message, "outbox publisher failed for good; the relay stops so it can be restarted with a new one");
                        break StopReason::PublisherFailed(message);
                    }
                    if empty && let Some(deadline) = drain_until {
                        // Empty can also mean that another batch holds every bucket with
                        // pending events, or that retries are due soon: drained only when
                        // nothing could be published before the last batch must start.
                        let within = deadline
                            .saturating_duration_since(Instant::now())
                            .saturating_sub(self.batch_budget);
                        let check = self.store.has_pending(within);
                        let pending = self
                            .store_step(
                                &mut report,
                                drain_until,
                                "checking for pending events",
                                check,
                            )
                            .await;
                        if pending == Some(false) {
                            break StopReason::Drained;
                        }
                    }
                    // Wait when there was nothing to do, or nothing could be done (a broker
                    // down); go on at once when the batch made progress, even if one key
                    // failed, so that a failing key does not slow the others down.
                    if stalled >= STALLED_BEFORE_RECOVERY
                        && last_recovery.is_none_or(|at| at.elapsed() >= RECOVERY_EVERY)
                        && self.publisher.recover().await
                    {
                        // A refusal (a transport too young to judge) is asked again after
                        // the next stalled batch.
                        last_recovery = Some(Instant::now());
                        stalled = 0;
                        self.counters.publisher_recovered();
                    }
                    if stuck {
                        Some(self.poll_interval)
                    } else if empty {
                        let wait = idle_wait;
                        idle_wait = idle_wait.saturating_mul(2).min(self.poll_interval);
                        Some(wait)
                    } else {
                        idle_wait = min_poll;
                        None
                    }
                }
                Err(error) => {
                    self.store_failed(&mut report, &error);
                    Some(self.poll_interval)
                }
            };
            if recovered > 0 || released_last > 0 || Instant::now() >= release_due {
                release_due = Instant::now() + RELEASE_EVERY;
                released_last = self.release_held_back(&mut report, drain_until).await;
            }
            match wait {
                Some(wait) => {
                    // A nudge means new work that may be claimable, so it ends the wait
                    // after a failure too (failed events themselves wait for their
                    // backoff, which the store keeps).
                    let sleep = tokio::time::sleep(until(wait, drain_until).0);
                    tokio::select! {
                        biased;
                        () = token.cancelled() => {}
                        () = sleep => {}
                        () = listener.notified() => {}
                    }
                }
                // More may be pending: go on at once, but let the runtime's other tasks (other
                // relays, the writers) run first, since a store and publisher that never wait
                // would otherwise keep this task on the thread.
                None => tokio::task::yield_now().await,
            }
        };
        wake_ups_token.cancel();
        if let Some(listener) = wake_ups {
            // It stops at its next await; a failure of it is logged where it happened.
            drop(listener.await);
        }
        if let Some(reader) = stats_reader {
            drop(reader.await);
        }
        // A drain counts what it left only within its deadline.
        let count_for = until(REPORT_STATS_TIMEOUT, drain_until).0;
        report.left = match tokio::time::timeout(count_for, self.store.stats()).await {
            Ok(Ok(stats)) => Some(stats),
            Ok(Err(error)) => {
                tracing::debug!(relay = %self.name, %error, "outbox relay could not count what it left");
                None
            }
            Err(_) => None,
        };
        report.stopped = stopped;
        tracing::debug!(relay = %self.name, stopped = %report.stopped, dispatched = report.dispatched, "outbox relay stopped");
        report
    }

    /// Gives the store's waiting events whose key recovered back to the claim; returns how
    /// many (0 after a failure, which is logged and counted).
    async fn release_held_back(&self, report: &mut RelayReport, deadline: Option<Instant>) -> u64 {
        let step = self.store.release_held_back(crate::store::RELEASE_STEP);
        let released = self
            .store_step(report, deadline, "releasing waiting events", step)
            .await
            .unwrap_or(0);
        if released > 0 {
            tracing::debug!(relay = %self.name, released, "outbox events waiting behind a recovered key released");
        }
        released
    }

    /// One store call between batches, bounded by its share of the batch budget and by a
    /// drain's `deadline`. `None` when it failed or timed out (counted and logged as a store
    /// failure), or when the deadline came first (nothing failed: the loop ends at its top).
    async fn store_step<T>(
        &self,
        report: &mut RelayReport,
        deadline: Option<Instant>,
        what: &str,
        step: impl Future<Output = Result<T, StoreError>>,
    ) -> Option<T> {
        let (allowed, cut) = until(self.batch_budget.mul_f64(CLAIM_SHARE), deadline);
        match tokio::time::timeout(allowed, step).await {
            Ok(Ok(value)) => Some(value),
            Ok(Err(error)) => {
                self.store_failed(report, &error);
                None
            }
            Err(_) if cut => None,
            Err(_) => {
                self.store_failed(report, &StoreError::TimedOut(what.to_owned()));
                None
            }
        }
    }

    fn store_failed(&self, report: &mut RelayReport, error: &StoreError) {
        self.counters.store_error();
        report.store_errors += 1;
        tracing::warn!(relay = %self.name, %error, source = ?std::error::Error::source(error), "outbox store failed; retrying after the poll interval");
    }
}

/// `own`, cut short to the time left before `deadline` (a drain's), and whether it was cut.
fn until(own: Duration, deadline: Option<Instant>) -> (Duration, bool) {
    match deadline {
        Some(deadline) => {
            let left = deadline.saturating_duration_since(Instant::now());
            (own.min(left), left < own)
        }
        None => (own, false),
    }
}

/// Reads the store's counts into the metrics; a parked count that grew is a warning.
async fn read_stats<S: Store>(store: &S, counters: &Counters, name: &str) {
    match tokio::time::timeout(READ_STATS_TIMEOUT, store.stats()).await {
        Ok(Ok(stats)) => {
            let before = counters.store_stats(stats);
            tracing::debug!(relay = %name, pending = stats.pending, backing_off = stats.backing_off, parked = stats.parked, behind_parked = stats.behind_parked, lag = ?stats.oldest_pending_age, "outbox stats");
            if stats.parked > before.map_or(0, |b| b.parked) {
                tracing::warn!(relay = %name, parked = stats.parked, behind_parked = stats.behind_parked, "outbox has parked events: list them with Store::parked, retry or purge them after fixing the cause");
            }
        }
        Ok(Err(error)) => {
            tracing::debug!(relay = %name, %error, "outbox relay could not read the store's counts");
        }
        Err(_) => {
            tracing::debug!(relay = %name, "outbox relay's stats query timed out");
        }
    }
}
