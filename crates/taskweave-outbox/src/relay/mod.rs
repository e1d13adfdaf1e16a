//! The relay: claims batches from a [`Store`], publishes them, marks what was delivered.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use taskweave_shutdown::Shutdown;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{PublishError, PublishErrorKind, StoreError};
use crate::publish::Publisher;
use crate::retry::{FailedAttempt, NextAttempt, RetryPolicy};
use crate::store::{Batch, ClaimLimits, Store};

mod metrics;
mod report;

pub use metrics::{RelayMetrics, RelayMetricsHandle};
pub use report::{BatchSummary, RelayReport, StopReason};

use metrics::Counters;

/// The share of the batch budget by whose end every acknowledgement must be in (the claim
/// included); the rest is the commit's.
const PUBLISH_SHARE: f64 = 0.8;

/// The share of the batch budget the claim may take.
const CLAIM_SHARE: f64 = 0.1;

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

/// Publishes the events of a [`Store`] through a [`Publisher`], batch after batch.
///
/// One batch is one store transaction: claim up to
/// [`buckets_per_batch`](Self::with_buckets_per_batch) key buckets that no other relay
/// holds, read up to [`batch_size`](Self::with_batch_size) of their pending events in id
/// order, send them all, await every acknowledgement, mark the delivered ones dispatched,
/// commit. Guarantees:
///
/// - **At least once.** An event is marked dispatched only after its acknowledgement, in
///   the transaction that claimed it. A crash anywhere in a batch rolls the marks back, and
///   the events are published again by whichever relay claims their bucket next.
/// - **Per-key order of first delivery**, with any number of relays on any number of
///   machines: a key's bucket is held by one batch at a time (`FOR UPDATE SKIP LOCKED`,
///   released at commit or, after a crash, by the server's rollback: no leases or
///   heartbeats). Within a batch a key's events are sent in id order; after a key's event
///   fails, its later events in the batch are not sent, and are not marked even if they
///   were sent already (then they are sent again after the failed one: see
///   [`RelayMetrics::sent_after_failure`]).
/// - **A failing key waits alone.** A failed publish is recorded on its event (attempts,
///   next attempt, error) in the batch's transaction, and the event and its key's later
///   events back off under the [`RetryPolicy`]; after its last attempt, or at once for a
///   permanent error (too large, unknown topic, not authorised), the event is parked until
///   an operator acts ([`Store::parked`]). Every other key flows meanwhile, including the
///   keys of the same bucket.
/// - **A batch is never cut off.** Cancelling the token stops the relay *between* batches:
///   the batch in flight finishes (publish, commit) and no new one starts. A batch is
///   bounded by its [budget](Self::with_batch_budget): 80 % for publishing, after which
///   unacknowledged events count as failed, and the rest for the commit.
/// - **Bounded latency.** After a batch that found events the next starts at once. When
///   there is nothing to do it polls adaptively: first after the
///   [short interval](Self::with_min_poll_interval), doubling after each empty poll up to
///   the [poll interval](Self::with_poll_interval); a writer in this process (see
///   [`PgStore::commit`](crate::PgStore::commit)), or in any process with
///   [`PgStore::with_notify`](crate::PgStore::with_notify), wakes it at once. After a
///   store failure, or a batch in which nothing could be published, it waits a full
///   interval.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_outbox::{Event, MemoryPublisher, MemoryStore, Relay, StopReason};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let store = MemoryStore::new(16);
/// let publisher = MemoryPublisher::new();
/// for i in 0..3 {
///     store.enqueue(Event::new("orders", format!("order-{i}"), b"created".to_vec())).unwrap();
/// }
///
/// let token = CancellationToken::new();
/// let relay = Relay::new(store.clone(), publisher.clone()).with_poll_interval(Duration::from_millis(100));
/// let running = tokio::spawn(relay.run(token.clone()));
/// tokio::time::sleep(Duration::from_secs(1)).await;
/// token.cancel();
/// let report = running.await.unwrap();
///
/// assert_eq!(publisher.published().len(), 3);
/// assert_eq!(store.pending(), 0);
/// assert_eq!(report.dispatched, 3);
/// assert_eq!(report.stopped, StopReason::Cancelled);
/// # }
/// ```
pub struct Relay<S, P> {
    store: Arc<S>,
    publisher: P,
    name: String,
    batch_size: u32,
    buckets_per_batch: u32,
    poll_interval: Duration,
    min_poll_interval: Duration,
    batch_budget: Duration,
    retry: RetryPolicy,
    stats_interval: Option<Duration>,
    shutdown: Option<Shutdown>,
    counters: Arc<Counters>,
    #[cfg(feature = "test-hooks")]
    hook: Option<hooks::Hook>,
}

impl<S: Store, P: Publisher> Relay<S, P> {
    /// A relay from `store` to `publisher` with batches of up to 500 events from up to 16
    /// buckets, a poll interval from 10 ms (just after work) up to 500 ms (idle), a 10 s
    /// batch budget and the default [`RetryPolicy`].
    pub fn new(store: S, publisher: P) -> Self {
        Self {
            store: Arc::new(store),
            publisher,
            name: "outbox relay".to_owned(),
            batch_size: 500,
            buckets_per_batch: 16,
            poll_interval: Duration::from_millis(500),
            min_poll_interval: Duration::from_millis(10),
            batch_budget: Duration::from_secs(10),
            retry: RetryPolicy::new(),
            stats_interval: Some(Duration::from_secs(30)),
            shutdown: None,
            counters: Arc::default(),
            #[cfg(feature = "test-hooks")]
            hook: None,
        }
    }

    /// Names the relay in its report and `tracing` events.
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The most events in one batch.
    ///
    /// # Panics
    ///
    /// Panics if `size` is zero.
    #[must_use]
    pub fn with_batch_size(mut self, size: u32) -> Self {
        assert!(
            size > 0,
            "Relay::with_batch_size: the size must be greater than zero"
        );
        self.batch_size = size;
        self
    }

    /// The most buckets one batch claims. Fewer means more relays can work at once (each
    /// holds fewer buckets); more means fewer batches when events are spread thinly. A
    /// quarter of the bucket count or less lets four relays share the work.
    ///
    /// # Panics
    ///
    /// Panics if `buckets` is zero.
    #[must_use]
    pub fn with_buckets_per_batch(mut self, buckets: u32) -> Self {
        assert!(
            buckets > 0,
            "Relay::with_buckets_per_batch: the count must be greater than zero"
        );
        self.buckets_per_batch = buckets;
        self
    }

    /// The longest wait between two polls when there is nothing to publish, and the wait
    /// after a failure.
    ///
    /// # Panics
    ///
    /// Panics if `interval` is zero.
    #[must_use]
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        assert!(
            !interval.is_zero(),
            "Relay::with_poll_interval: the interval must be greater than zero"
        );
        self.poll_interval = interval;
        self
    }

    /// The first wait after a batch that found work came back empty; each further empty
    /// poll doubles it, up to the [poll interval](Self::with_poll_interval). Writers in
    /// other processes (without [`PgStore::with_notify`](crate::PgStore::with_notify)) are
    /// then seen within this long while events keep coming, at the cost of a few more
    /// polls each time the flow stops. Set it equal to the poll interval for a fixed
    /// interval.
    ///
    /// # Panics
    ///
    /// Panics if `interval` is zero.
    #[must_use]
    pub fn with_min_poll_interval(mut self, interval: Duration) -> Self {
        assert!(
            !interval.is_zero(),
            "Relay::with_min_poll_interval: the interval must be greater than zero"
        );
        self.min_poll_interval = interval;
        self
    }

    /// How often the relay reads [`Store::stats`] (pending, lag, parked) into its
    /// [metrics](Self::metrics) and a `tracing` debug event (default every 30 s; `None`:
    /// never), on a task of its own, so a slow count never delays a batch. The count reads
    /// every pending row's index entry (about a second per million pending events on a
    /// 2-core machine): with many relays and deep backlogs, read it from one of them.
    #[must_use]
    pub fn with_stats_interval(mut self, interval: Option<Duration>) -> Self {
        self.stats_interval = interval;
        self
    }

    /// How failed events are retried before they are parked.
    #[must_use]
    pub fn with_retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The longest one batch may take, claim to commit: 80 % for publishing, the rest for
    /// the commit. Size it below the time your shutdown gives the relay; set the Kafka
    /// producer's `message.timeout.ms` below 80 % of it (the default publisher uses 5 s
    /// against the default budget of 10 s) so acknowledgements come back in time.
    ///
    /// # Panics
    ///
    /// Panics if `budget` is zero.
    #[must_use]
    pub fn with_batch_budget(mut self, budget: Duration) -> Self {
        assert!(
            !budget.is_zero(),
            "Relay::with_batch_budget: the budget must be greater than zero"
        );
        self.batch_budget = budget;
        self
    }

    /// Holds a critical section of `shutdown` for each batch, so the shutdown waits for a
    /// batch in flight before it closes its resources (the database pool, the producer),
    /// and starts no batch once it is closing them.
    #[must_use]
    pub fn with_shutdown(mut self, shutdown: &Shutdown) -> Self {
        self.shutdown = Some(shutdown.clone());
        self
    }

    /// A handle to the relay's counters, readable while it runs.
    #[must_use]
    pub fn metrics(&self) -> RelayMetricsHandle {
        RelayMetricsHandle::new(Arc::clone(&self.counters))
    }

    /// The batch budget.
    #[must_use]
    pub fn batch_budget(&self) -> Duration {
        self.batch_budget
    }

    /// Relays until `token` is cancelled; the batch in flight then finishes, and no new one
    /// starts.
    ///
    /// Store and publish failures never end the relay: they are counted, logged at warn,
    /// and retried after the poll interval.
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
    /// `deadline`. For a shutdown phase that publishes what this instance wrote before it
    /// exits: `relay.drain(ctx.token().clone(), ctx.deadline())`.
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
                loop {
                    read_stats(&*store, &counters, &name).await;
                    if token
                        .run_until_cancelled(tokio::time::sleep(every))
                        .await
                        .is_none()
                    {
                        return;
                    }
                }
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
                        match self.store.has_pending(within).await {
                            Ok(false) => break StopReason::Drained,
                            Ok(true) => {}
                            Err(error) => self.store_failed(&mut report, &error),
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
                released_last = self.release_held_back(&mut report).await;
            }
            match wait {
                Some(wait) => {
                    // A nudge means new work that may be claimable, so it ends the wait
                    // after a failure too (failed events themselves wait for their
                    // backoff, which the store keeps).
                    let sleep = tokio::time::sleep(wait);
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
        report.left = match tokio::time::timeout(REPORT_STATS_TIMEOUT, self.store.stats()).await {
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
    async fn release_held_back(&self, report: &mut RelayReport) -> u64 {
        let step = self.store.release_held_back(crate::store::RELEASE_STEP);
        match tokio::time::timeout(self.batch_budget.mul_f64(CLAIM_SHARE), step).await {
            Ok(Ok(released)) => {
                if released > 0 {
                    tracing::debug!(relay = %self.name, released, "outbox events waiting behind a recovered key released");
                }
                released
            }
            Ok(Err(error)) => {
                self.store_failed(report, &error);
                0
            }
            Err(_) => {
                self.store_failed(
                    report,
                    &StoreError::TimedOut("releasing waiting events".to_owned()),
                );
                0
            }
        }
    }

    fn store_failed(&self, report: &mut RelayReport, error: &StoreError) {
        self.counters.store_error();
        report.store_errors += 1;
        tracing::warn!(relay = %self.name, %error, source = ?std::error::Error::source(error), "outbox store failed; retrying after the poll interval");
    }

    /// One batch: claim, send in id order, await acknowledgements, mark, commit. Never
    /// raced against the token.
    async fn batch(&self) -> Result<BatchSummary, StoreError> {
        let started = Instant::now();
        let publish_deadline = started
            .checked_add(self.batch_budget.mul_f64(PUBLISH_SHARE))
            .unwrap_or_else(|| started + Duration::from_secs(100 * 365 * 86_400));
        // The claim gets a tenth of the budget (a pool that has no connection to give, a
        // server that does not answer); dropping a claim halfway is safe (see `Store`).
        let claim = self.store.claim(ClaimLimits {
            buckets: self.buckets_per_batch,
            events: self.batch_size,
            hold_at_most: self.batch_budget,
        });
        let batch = tokio::time::timeout(self.batch_budget.mul_f64(CLAIM_SHARE), claim)
            .await
            .map_err(|_| StoreError::TimedOut("claiming a batch".to_owned()))??;
        let records = batch.records();
        let mut summary = BatchSummary {
            claimed: records.len(),
            ..BatchSummary::default()
        };
        if records.is_empty() {
            self.counters.empty_poll();
            batch.commit(Vec::new()).await?;
            summary.took = started.elapsed();
            return Ok(summary);
        }
        self.hook(hooks::Point::BeforePublish).await;

        // Send in id order. A key whose record failed to send is blocked for the rest of
        // the batch; so is everything after a send that ran out of time.
        let mut blocked: HashSet<&[u8]> = HashSet::new();
        let mut outcomes: Vec<Outcome> = vec![Outcome::HeldBack; records.len()];
        let mut deliveries = FuturesUnordered::new();
        let mut out_of_time = false;
        for (index, record) in records.iter().enumerate() {
            if out_of_time || blocked.contains(record.key.as_slice()) {
                summary.held_back += 1;
                continue;
            }
            match tokio::time::timeout_at(publish_deadline, self.publisher.send(record)).await {
                Ok(Ok(delivery)) => {
                    outcomes[index] = Outcome::Sent;
                    deliveries.push(async move { (index, delivery.await) });
                }
                Ok(Err(error)) => {
                    tracing::warn!(relay = %self.name, id = record.id, topic = %record.topic, %error, "outbox publish failed");
                    blocked.insert(record.key.as_slice());
                    if error.kind() == PublishErrorKind::Fatal {
                        summary
                            .fatal
                            .get_or_insert_with(|| error.message().to_owned());
                        // Nothing more can go through this publisher.
                        out_of_time = true;
                    }
                    outcomes[index] = Outcome::Failed(error);
                }
                Err(_) => {
                    tracing::warn!(relay = %self.name, id = record.id, "outbox batch ran out of publish time while sending");
                    out_of_time = true;
                    summary.held_back += 1;
                }
            }
        }
        loop {
            match tokio::time::timeout_at(publish_deadline, deliveries.next()).await {
                Ok(Some((index, Ok(())))) => outcomes[index] = Outcome::Delivered,
                Ok(Some((index, Err(error)))) => {
                    let record = &records[index];
                    tracing::warn!(relay = %self.name, id = record.id, topic = %record.topic, %error, "outbox publish failed");
                    if error.kind() == PublishErrorKind::Fatal {
                        summary
                            .fatal
                            .get_or_insert_with(|| error.message().to_owned());
                    }
                    outcomes[index] = Outcome::Failed(error);
                }
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(relay = %self.name, unacknowledged = deliveries.len(), "outbox batch ran out of publish time awaiting acknowledgements");
                    summary.timed_out = deliveries.len();
                    break;
                }
            }
        }
        drop(deliveries);
        self.hook(hooks::Point::AfterAcks).await;

        // Mark a key's records while they succeed; at its first failure record the failed
        // attempt (back off or park) and mark nothing more of it.
        let mut failed_keys: HashSet<&[u8]> = HashSet::new();
        let mut dispatched = Vec::with_capacity(records.len());
        let mut failed = Vec::new();
        for (record, outcome) in records.iter().zip(outcomes) {
            let key = record.key.as_slice();
            if failed_keys.contains(key) {
                if matches!(outcome, Outcome::Delivered) {
                    summary.sent_after_failure += 1;
                }
                continue;
            }
            let error = match outcome {
                Outcome::Delivered => {
                    dispatched.push(record.id);
                    summary.recovered += usize::from(record.attempts > 0);
                    continue;
                }
                Outcome::HeldBack => {
                    // Never sent (time ran out, or the publisher failed for good): not the
                    // event's fault, so no attempt is counted.
                    failed_keys.insert(key);
                    continue;
                }
                Outcome::Sent => {
                    PublishError::retriable("no acknowledgement within the batch's publish time")
                }
                Outcome::Failed(error) => error,
            };
            failed_keys.insert(key);
            summary.failed += 1;
            self.counters.publish_failed(error.kind(), 1);
            if error.kind() == PublishErrorKind::Fatal {
                // The publisher broke, not the event: it is retried by the next relay.
                continue;
            }
            let attempts = record.attempts.saturating_add(1);
            let next = self.retry.next(record.id, attempts, error.kind());
            match next {
                NextAttempt::Park => {
                    summary.parked += 1;
                    tracing::error!(relay = %self.name, id = record.id, event_id = %record.event_id, topic = %record.topic, attempts, %error, "outbox event parked: it and the later events of its key wait for an operator (Store::parked)");
                }
                NextAttempt::After(delay) => {
                    summary.backing_off += 1;
                    tracing::debug!(relay = %self.name, id = record.id, attempts, ?delay, "outbox event backs off");
                }
            }
            failed.push(FailedAttempt {
                id: record.id,
                error: error.to_string(),
                next,
            });
        }
        let delivered = dispatched.len();
        summary.stalled =
            delivered == 0 && summary.failed > 0 && summary.fatal.is_none() && summary.parked == 0;
        let (parked, backing_off) = (summary.parked, summary.backing_off);
        match batch.complete(dispatched, failed).await {
            Ok(()) => {
                summary.dispatched = delivered;
                self.counters.batch_committed(&summary, parked, backing_off);
            }
            Err(error) => {
                // Published but not marked: these will be published again.
                summary.commit_failed = true;
                summary.recovered = 0;
                summary.parked = 0;
                summary.backing_off = 0;
                self.counters.commit_failed(delivered);
                tracing::warn!(relay = %self.name, error = %error, published = delivered, "outbox commit failed after publishing: these events will be published again");
            }
        }
        self.hook(hooks::Point::AfterCommit).await;
        summary.took = started.elapsed();
        self.counters.batch_took(summary.claimed, summary.took);
        tracing::debug!(relay = %self.name, claimed = summary.claimed, dispatched = summary.dispatched, failed = summary.failed, took = ?summary.took, "outbox batch");
        Ok(summary)
    }

    #[cfg(feature = "test-hooks")]
    async fn hook(&self, point: hooks::Point) {
        if let Some(hook) = &self.hook {
            hook(point).await;
        }
    }

    #[cfg(not(feature = "test-hooks"))]
    #[allow(
        clippy::unused_async,
        reason = "the same call with and without test hooks"
    )]
    async fn hook(&self, _point: hooks::Point) {}
}

#[cfg(feature = "test-hooks")]
impl<S, P> Relay<S, P> {
    /// Awaits `hook` at each named point of every batch that claimed events (test-only: a
    /// crash test parks the relay at a point and then aborts it or kills its process).
    #[must_use]
    pub fn with_hook(
        mut self,
        hook: impl Fn(hooks::Point) -> futures::future::BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> Self {
        self.hook = Some(Arc::new(hook));
        self
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

/// Where one record of a batch stands.
#[derive(Clone, Debug)]
enum Outcome {
    /// Not sent.
    HeldBack,
    /// Sent; no acknowledgement yet (or none within the publish time).
    Sent,
    /// Acknowledged.
    Delivered,
    /// Refused at send, or its acknowledgement failed.
    Failed(PublishError),
}

impl<S, P> fmt::Debug for Relay<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("name", &self.name)
            .field("batch_size", &self.batch_size)
            .field("buckets_per_batch", &self.buckets_per_batch)
            .field("poll_interval", &self.poll_interval)
            .field("batch_budget", &self.batch_budget)
            .finish_non_exhaustive()
    }
}

/// Named points inside a batch, for crash tests (`test-hooks` feature).
pub mod hooks {
    /// Where a batch is.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    #[non_exhaustive]
    pub enum Point {
        /// Claimed, nothing sent yet.
        BeforePublish,
        /// Every acknowledgement is in; not committed yet.
        AfterAcks,
        /// Committed (or the commit failed).
        AfterCommit,
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) type Hook =
        std::sync::Arc<dyn Fn(Point) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;
}
