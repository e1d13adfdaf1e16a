//! The consuming end: a Kafka consumer runner that hands each message to a handler, in
//! order per partition and in parallel across partitions, and commits an offset only after
//! its message was handled (at least once); and, with the `postgres` feature, a
//! transactional [`Inbox`] that makes a handler's effects in the database happen once.

#[cfg(feature = "postgres")]
mod inbox;
mod message;
mod partition;
mod report;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use tokio::sync::{Semaphore, oneshot};
use tokio_util::sync::CancellationToken;

use crate::retry::RetryPolicy;
use partition::{Counters, Partition, Workers, lock};

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use inbox::{Inbox, InboxHandler, InboxStats, StalePolicy};
pub use message::{HandleError, Handler, Received};
pub use partition::{
    DEAD_LETTER_ATTEMPTS_HEADER, DEAD_LETTER_ERROR_HEADER, DEAD_LETTER_ORIGIN_HEADER, DeadLetter,
};
pub use report::{AbandonReason, Abandoned, ConsumerMetrics, ConsumerReport};

/// How long the poll thread waits in one `poll`: also how soon it sees a stop.
const POLL_TIMEOUT: Duration = Duration::from_millis(50);

/// Why a consumer could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConsumeError {
    /// librdkafka refused the configuration.
    Config(KafkaError),
    /// The brokers did not answer within the start-up timeout.
    Unreachable {
        /// `bootstrap.servers`.
        brokers: String,
        /// librdkafka's error.
        error: KafkaError,
    },
    /// A topic to consume does not exist.
    UnknownTopic(String),
    /// No topic was given, or `group.id` is missing.
    Invalid(String),
    /// The subscription failed.
    Subscribe(KafkaError),
    /// `start` was not called inside a tokio runtime.
    NoRuntime,
}

impl fmt::Display for ConsumeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(error) => write!(f, "the consumer's configuration was refused: {error}"),
            Self::Unreachable { brokers, error } => {
                write!(f, "the Kafka brokers at {brokers} did not answer: {error}")
            }
            Self::UnknownTopic(topic) => write!(f, "topic {topic} does not exist"),
            Self::Invalid(what) => f.write_str(what),
            Self::Subscribe(error) => write!(f, "subscribing failed: {error}"),
            Self::NoRuntime => f.write_str("Consumer::start must be called inside a tokio runtime"),
        }
    }
}

impl std::error::Error for ConsumeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Config(error) | Self::Subscribe(error) | Self::Unreachable { error, .. } => {
                Some(error)
            }
            _ => None,
        }
    }
}

/// A Kafka consumer group member that runs a [`Handler`] for every message.
///
/// # Guarantees
///
/// - **Order**: the messages of one partition are handled one at a time, in offset order
///   (also across a rebalance that gives the partition back to this consumer while a
///   handler of the old assignment still runs). Partitions are handled in parallel, at most
///   [`with_max_in_flight`](Self::with_max_in_flight) handlers at once.
/// - **At least once**: an offset is committed only once its message and every earlier one
///   of its partition were handled (or dead-lettered). Commits are batched: every
///   [`with_commit_interval`](Self::with_commit_interval), at a revocation, and at the
///   stop. After a crash, what was handled since the last commit is delivered again; use
///   the event id (or the [`Inbox`]) to make that harmless.
/// - **Failures**: a handler's error or panic is retried with backoff
///   ([`with_retry`](Self::with_retry), per message); after the last attempt, or at once
///   for a [permanent](HandleError::permanent) error, the message goes to the dead-letter
///   topic ([`with_dead_letter`](Self::with_dead_letter)) with the error in
///   [`DEAD_LETTER_ERROR_HEADER`], and the partition moves on. With no dead-letter topic,
///   the partition keeps retrying the message at the policy's longest delay: nothing is
///   skipped silently.
/// - **Rebalances**: when partitions are revoked, their workers take no further message, the
///   handlers in flight get [`with_revoke_timeout`](Self::with_revoke_timeout) to finish,
///   and what finished is committed before the partitions go. A handler that overruns is
///   reported ([`ConsumerReport::abandoned`]) and its offset is not committed.
/// - **Stop**: when the token is cancelled (or [`RunningConsumer::stop`] is called) the
///   consumer stops fetching, lets the handlers in flight finish until the deadline,
///   commits what finished, and leaves the group (so the partitions move to another member
///   at once, not after the session timeout).
///
/// Handlers run on the tokio runtime that called [`start`](Self::start); librdkafka is
/// polled on a thread of the consumer's own, so a slow handler never delays fetching or
/// the group's heartbeats (a revocation does wait, up to the revoke timeout, for the
/// revoked partitions' handlers in flight).
///
/// Commits go to the group coordinator: the periodic ones without waiting, the ones at a
/// revocation and at the stop waiting for its answer. With the brokers gone, that answer
/// can take until librdkafka gives up (about `session.timeout.ms`), so a stop may then
/// return after its deadline; bound it with a timeout where that matters.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use taskweave_outbox::consume::{Consumer, HandleError, Received};
/// use tokio_util::sync::CancellationToken;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let token = CancellationToken::new();
/// let consumer = Consumer::new("127.0.0.1:9092", "billing", ["order-events"])
///     .with_max_in_flight(8)
///     .start(token.clone(), |message: Received| async move {
///         let id = message.event_id().ok_or(HandleError::permanent("no event id"))?;
///         println!("order event {id}");
///         Ok(())
///     })
///     .await?;
/// // … later, at shutdown:
/// let report = consumer.stop_within(Duration::from_secs(10)).await;
/// assert!(report.is_clean(), "{report}");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Consumer {
    config: ClientConfig,
    topics: Vec<String>,
    name: String,
    max_in_flight: usize,
    max_queued: usize,
    commit_interval: Duration,
    revoke_timeout: Duration,
    stop_budget: Duration,
    startup_timeout: Duration,
    retry: RetryPolicy,
    dead_letter: Option<DeadLetter>,
}

impl Consumer {
    /// A consumer in group `group` of `topics`, with [`config`](Self::config).
    #[must_use]
    pub fn new<I, T>(brokers: &str, group: &str, topics: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        Self::from_config(Self::config(brokers, group), topics)
    }

    /// The settings the guarantees rest on: `enable.auto.commit=false` and
    /// `enable.auto.offset.store=false` (the consumer commits itself, after handling), and
    /// `auto.offset.reset=earliest` (a new group starts at the beginning, so nothing written
    /// before it joined is skipped).
    #[must_use]
    pub fn config(brokers: &str, group: &str) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest");
        config
    }

    /// A consumer with your own settings (keep `enable.auto.commit=false`: an automatic
    /// commit would commit messages not yet handled).
    #[must_use]
    pub fn from_config<I, T>(config: ClientConfig, topics: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        Self {
            config,
            topics: topics.into_iter().map(Into::into).collect(),
            name: "consumer".to_owned(),
            max_in_flight: 16,
            max_queued: 10_000,
            commit_interval: Duration::from_secs(1),
            revoke_timeout: Duration::from_secs(10),
            stop_budget: Duration::from_secs(10),
            startup_timeout: Duration::from_secs(10),
            retry: RetryPolicy::new()
                .with_max_attempts(5)
                .with_initial_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(30)),
            dead_letter: None,
        }
    }

    /// The name in logs and task names.
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// At most `n` handlers at once, over all partitions (default 16).
    ///
    /// # Panics
    ///
    /// Panics if `n` is zero.
    #[must_use]
    pub fn with_max_in_flight(mut self, n: usize) -> Self {
        assert!(n > 0, "Consumer::with_max_in_flight: must be at least 1");
        self.max_in_flight = n.min(Semaphore::MAX_PERMITS);
        self
    }

    /// A partition whose queue holds `n` messages not yet handled is paused until it drains
    /// to half (default 10 000): memory stays bounded when one partition is slow. A pause
    /// is not free: the partition's fetch restarts with the next fetch request, which may
    /// wait up to `fetch.wait.max.ms` (500 ms) behind a long poll; measured here, a
    /// threshold of 1000 with a fast handler cost two thirds of the throughput.
    ///
    /// # Panics
    ///
    /// Panics if `n` is zero.
    #[must_use]
    pub fn with_max_queued_per_partition(mut self, n: usize) -> Self {
        assert!(
            n > 0,
            "Consumer::with_max_queued_per_partition: must be at least 1"
        );
        self.max_queued = n;
        self
    }

    /// How often handled offsets are committed (default 1 s): also, at most, what is
    /// delivered again after a crash.
    #[must_use]
    pub fn with_commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval;
        self
    }

    /// How long a revocation waits for the handlers in flight of the revoked partitions
    /// (default 10 s; keep it below `max.poll.interval.ms`).
    #[must_use]
    pub fn with_revoke_timeout(mut self, timeout: Duration) -> Self {
        self.revoke_timeout = timeout;
        self
    }

    /// How long the handlers in flight get when the token is cancelled (default 10 s).
    /// [`RunningConsumer::stop`] takes its own deadline.
    #[must_use]
    pub fn with_stop_budget(mut self, budget: Duration) -> Self {
        self.stop_budget = budget;
        self
    }

    /// How long [`start`](Self::start) waits for the brokers' answer (default 10 s).
    #[must_use]
    pub fn with_startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// How a failing message is retried (default: 5 attempts, 200 ms doubling to 30 s, with
    /// jitter from the offset). After the last one it is dead-lettered.
    #[must_use]
    pub fn with_retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Where messages that failed for good go.
    #[must_use]
    pub fn with_dead_letter(mut self, dead_letter: DeadLetter) -> Self {
        self.dead_letter = Some(dead_letter);
        self
    }

    /// Joins the group and starts handling: checks that the brokers answer and the topics
    /// exist (within the start-up timeout), subscribes, and starts the poll thread. It stops
    /// when `token` is cancelled, giving the handlers in flight the stop budget.
    ///
    /// # Errors
    ///
    /// [`ConsumeError`]: the configuration refused, the brokers unreachable, a topic
    /// missing, no topic or no `group.id`, not inside a tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it resolves starts nothing (a consumer being created is
    /// closed again).
    pub async fn start<H: Handler>(
        self,
        token: CancellationToken,
        handler: H,
    ) -> Result<RunningConsumer, ConsumeError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| ConsumeError::NoRuntime)?;
        if self.topics.is_empty() {
            return Err(ConsumeError::Invalid(
                "Consumer: no topic to consume".into(),
            ));
        }
        if self.config.get("group.id").is_none_or(str::is_empty) {
            return Err(ConsumeError::Invalid(
                "Consumer: group.id is not set".into(),
            ));
        }
        let counters = Arc::new(Counters::default());
        let workers = Arc::new(Workers {
            name: self.name.clone(),
            handler_name: format!("{}: handler", self.name).into(),
            handler,
            permits: Semaphore::new(self.max_in_flight),
            retry: self.retry,
            dead_letter: self.dead_letter.clone(),
            counters: Arc::clone(&counters),
        });
        let spawner = runtime.clone();
        let control = Arc::new(Control {
            stop: CancellationToken::new(),
            deadline: Mutex::new(None),
        });
        let books = Arc::new(Books {
            partitions: Mutex::new(HashMap::new()),
            previous: Mutex::new(HashMap::new()),
            paused: std::sync::atomic::AtomicUsize::new(0),
            generation: std::sync::atomic::AtomicU64::new(0),
            control: Arc::clone(&control),
            counters: Arc::clone(&counters),
            revoke_timeout: self.revoke_timeout,
            start_worker: Box::new(move |partition, queue, previous| {
                let workers = Arc::clone(&workers);
                spawner.spawn(partition::work(workers, partition, queue, previous));
            }),
        });
        let context = Context {
            books: Arc::clone(&books),
        };
        let setup = self.clone();
        let consumer = tokio::task::spawn_blocking(move || setup.connect(context))
            .await
            .map_err(|_| ConsumeError::Invalid("the consumer's set-up panicked".into()))??;

        let (report_tx, report_rx) = oneshot::channel();
        let poll = PollLoop {
            consumer,
            books: Arc::clone(&books),
            token,
            control: Arc::clone(&control),
            commit_interval: self.commit_interval,
            stop_budget: self.stop_budget,
            max_queued: self.max_queued,
            name: self.name.clone(),
            routes: std::cell::RefCell::new((u64::MAX, HashMap::new())),
            pending: std::cell::RefCell::new(Vec::new()),
        };
        let thread = std::thread::Builder::new()
            .name(format!("{}-poll", self.name))
            .spawn(move || {
                let report = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| poll.run()))
                    .unwrap_or_else(|panic| ConsumerReport {
                        error: Some(format!(
                            "the poll thread panicked: {}",
                            panic_text(panic.as_ref())
                        )),
                        ..ConsumerReport::failed()
                    });
                let _ = report_tx.send(report);
            });
        if let Err(error) = thread {
            return Err(ConsumeError::Invalid(format!(
                "cannot start the poll thread: {error}"
            )));
        }
        Ok(RunningConsumer {
            control,
            counters,
            books,
            report: report_rx,
        })
    }

    /// Creates the consumer, checks the brokers and topics, subscribes (blocking).
    fn connect(&self, context: Context) -> Result<BaseConsumer<Context>, ConsumeError> {
        let consumer: BaseConsumer<Context> = self
            .config
            .create_with_context(context)
            .map_err(ConsumeError::Config)?;
        let metadata = consumer
            .fetch_metadata(None, self.startup_timeout)
            .map_err(|error| ConsumeError::Unreachable {
                brokers: self
                    .config
                    .get("bootstrap.servers")
                    .unwrap_or("")
                    .to_owned(),
                error,
            })?;
        for topic in &self.topics {
            let known = metadata
                .topics()
                .iter()
                .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty());
            if !known {
                return Err(ConsumeError::UnknownTopic(topic.clone()));
            }
        }
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(ConsumeError::Subscribe)?;
        Ok(consumer)
    }
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("name", &self.name)
            .field("topics", &self.topics)
            .field("max_in_flight", &self.max_in_flight)
            .field("commit_interval", &self.commit_interval)
            .finish_non_exhaustive()
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic".to_owned())
}

/// A started consumer.
///
/// Dropping it does not stop the consumer: cancel its token, or call
/// [`stop`](Self::stop).
pub struct RunningConsumer {
    control: Arc<Control>,
    counters: Arc<Counters>,
    books: Arc<Books>,
    report: oneshot::Receiver<ConsumerReport>,
}

impl fmt::Debug for RunningConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunningConsumer")
            .field("metrics", &self.metrics())
            .finish_non_exhaustive()
    }
}

impl RunningConsumer {
    /// The counts so far.
    #[must_use]
    pub fn metrics(&self) -> ConsumerMetrics {
        self.counters.snapshot()
    }

    /// A handle to the counts, readable after the consumer was moved away (into a shutdown
    /// phase, say).
    #[must_use]
    pub fn metrics_handle(&self) -> ConsumerMetricsHandle {
        ConsumerMetricsHandle {
            counters: Arc::clone(&self.counters),
        }
    }

    /// The partitions assigned now, as `(topic, partition)`.
    #[must_use]
    pub fn assignment(&self) -> Vec<(String, i32)> {
        let mut out: Vec<(String, i32)> = lock(&self.books.partitions).keys().cloned().collect();
        out.sort();
        out
    }

    /// Stops: no further fetch; the handlers in flight get until `deadline`; what finished
    /// is committed; the consumer leaves the group. Returns the report.
    ///
    /// # Cancel safety
    ///
    /// The stop is requested when the future is first polled; dropping the future after that
    /// does not undo it, only loses the report.
    pub async fn stop(self, deadline: tokio::time::Instant) -> ConsumerReport {
        *lock(&self.control.deadline) = Some(deadline.into_std());
        self.control.stop.cancel();
        self.join().await
    }

    /// [`stop`](Self::stop) with a deadline `budget` from now.
    ///
    /// # Cancel safety
    ///
    /// As [`stop`](Self::stop).
    pub async fn stop_within(self, budget: Duration) -> ConsumerReport {
        let now = tokio::time::Instant::now();
        let deadline = now
            .checked_add(budget)
            .or_else(|| now.checked_add(Duration::from_secs(u64::from(u32::MAX))))
            .unwrap_or(now);
        self.stop(deadline).await
    }

    /// Waits until the consumer has stopped (its token cancelled, or a fatal error), and
    /// returns the report.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future changes nothing but the report's loss.
    pub async fn join(self) -> ConsumerReport {
        self.report.await.unwrap_or_else(|_| ConsumerReport {
            error: Some("the poll thread ended without a report".into()),
            ..ConsumerReport::failed()
        })
    }

    /// Registers a [`taskweave_shutdown`] phase named `name` that stops the consumer within
    /// the phase's deadline, reports what it gave up as abandoned, and logs the report.
    /// Returns `false` when the shutdown has started already (the consumer is then left
    /// running: cancel its token).
    pub fn register_phase(self, shutdown: &taskweave_shutdown::Shutdown, name: &str) -> bool {
        let name_owned = name.to_owned();
        shutdown.phase(name, move |ctx| async move {
            let report = self.stop(ctx.deadline()).await;
            for a in &report.abandoned {
                ctx.abandon(format!(
                    "{}/{}/{} ({:?})",
                    a.topic, a.partition, a.offset, a.reason
                ));
            }
            if let Err(error) = &report.final_commit {
                ctx.abandon(format!("final commit: {error}"));
            }
            tracing::info!(consumer = %name_owned, %report, "consumer stopped");
        })
    }
}

/// Reads a consumer's counts while it runs ([`RunningConsumer::metrics_handle`]).
#[derive(Clone)]
pub struct ConsumerMetricsHandle {
    counters: Arc<Counters>,
}

impl ConsumerMetricsHandle {
    /// The counts now.
    #[must_use]
    pub fn snapshot(&self) -> ConsumerMetrics {
        self.counters.snapshot()
    }
}

impl fmt::Debug for ConsumerMetricsHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ConsumerMetricsHandle")
            .field(&self.snapshot())
            .finish()
    }
}

impl Counters {
    fn snapshot(&self) -> ConsumerMetrics {
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        ConsumerMetrics {
            handled: get(&self.handled),
            dead_lettered: get(&self.dead_lettered),
            failed_attempts: get(&self.failed_attempts),
            panics: get(&self.panics),
            commits: get(&self.commits),
            commit_failures: get(&self.commit_failures),
            assigned: get(&self.assigned),
            revoked: get(&self.revoked),
            pauses: get(&self.pauses),
            abandoned: get(&self.abandoned_total),
        }
    }
}

/// The stop request: a token the poll thread looks at between polls, and the deadline
/// (which `stop` may set, or move, while the poll thread already waits).
struct Control {
    stop: CancellationToken,
    deadline: Mutex<Option<std::time::Instant>>,
}

impl Control {
    fn deadline(&self) -> Option<std::time::Instant> {
        *lock(&self.deadline)
    }
}

/// `now + d`, or far ahead when that is beyond the clock's range (a "no limit" timeout).
pub(crate) fn after(d: Duration) -> std::time::Instant {
    let now = std::time::Instant::now();
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(u64::from(u32::MAX))))
        .unwrap_or(now)
}

type StartWorker = Box<
    dyn Fn(
            Arc<Partition>,
            tokio::sync::mpsc::UnboundedReceiver<Vec<Received>>,
            Option<Arc<Partition>>,
        ) + Send
        + Sync,
>;

/// The assigned partitions, shared by the poll loop and the rebalance callbacks (which run
/// on the poll thread, inside `poll`).
struct Books {
    partitions: Mutex<HashMap<(String, i32), Arc<Partition>>>,
    /// Partitions revoked (or stopped) while their worker still ran (a handler that overran):
    /// the next assignment's worker waits for theirs to finish.
    previous: Mutex<HashMap<(String, i32), Arc<Partition>>>,
    /// Partitions paused now, so the poll loop looks for drained ones only when there are.
    paused: std::sync::atomic::AtomicUsize,
    /// Bumped at every assignment and revocation: the poll loop's routing table is stale.
    generation: std::sync::atomic::AtomicU64,
    counters: Arc<Counters>,
    control: Arc<Control>,
    revoke_timeout: Duration,
    start_worker: StartWorker,
}

impl Books {
    fn assign<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>, list: &TopicPartitionList) {
        let mut fresh = TopicPartitionList::new();
        let mut partitions = lock(&self.partitions);
        lock(&self.previous).retain(|_, p| !p.finished.is_set());
        for element in list.elements() {
            let key = (element.topic().to_owned(), element.partition());
            if partitions.contains_key(&key) {
                continue;
            }
            let previous = lock(&self.previous).remove(&key);
            let (partition, queue) = Partition::new(element.topic(), element.partition());
            partitions.insert(key, Arc::clone(&partition));
            fresh.add_partition(element.topic(), element.partition());
            Counters::add(&self.counters.assigned);
            (self.start_worker)(partition, queue, previous);
        }
        drop(partitions);
        self.generation.fetch_add(1, Ordering::Release);
        // librdkafka keeps an application pause across a revocation: a partition paused
        // for back-pressure before it was revoked would come back paused for good.
        if fresh.count() > 0
            && let Err(error) = consumer.resume(&fresh)
        {
            tracing::warn!(%error, "resuming newly assigned partitions failed");
        }
    }

    /// Stops the partitions in `list`, waits for their handlers in flight until the revoke
    /// timeout (or the stop's deadline, if sooner), and commits what finished (unless the
    /// assignment was lost).
    fn revoke<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>, list: &TopicPartitionList) {
        let revoked: Vec<Arc<Partition>> = {
            let mut partitions = lock(&self.partitions);
            list.elements()
                .iter()
                .filter_map(|e| partitions.remove(&(e.topic().to_owned(), e.partition())))
                .collect()
        };
        self.generation.fetch_add(1, Ordering::Release);
        for partition in &revoked {
            partition.stop.cancel();
            if partition.paused.swap(false, Ordering::Relaxed) {
                self.paused.fetch_sub(1, Ordering::Relaxed);
            }
            Counters::add(&self.counters.revoked);
        }
        let until = after(self.revoke_timeout);
        self.wait_for(&revoked, || {
            self.control
                .deadline()
                .map_or(until, |stop| stop.min(until))
        });
        if !consumer.assignment_lost() {
            let _ = commit(consumer, &revoked, &self.counters, CommitMode::Sync);
        }
    }

    /// Waits for `partitions`' workers until `deadline()` (read again as it waits, so a stop
    /// can shorten or lengthen it); reports the handlers that overran, caps their commits
    /// below the message they were on, and keeps their partitions for the next assignment's
    /// worker to wait on.
    fn wait_for(&self, partitions: &[Arc<Partition>], deadline: impl Fn() -> std::time::Instant) {
        for partition in partitions {
            loop {
                let until = deadline();
                let slice = until.min(after(Duration::from_millis(50)));
                if partition.finished.wait_until(slice) || std::time::Instant::now() >= until {
                    break;
                }
            }
            if partition.finished.is_set() {
                continue;
            }
            if let Some(offset) = partition.give_up() {
                self.abandon(Abandoned {
                    topic: partition.topic.clone(),
                    partition: partition.partition,
                    offset,
                    reason: AbandonReason::Overran,
                    failed_attempts: 0,
                });
            }
            lock(&self.previous).insert(
                (partition.topic.clone(), partition.partition),
                Arc::clone(partition),
            );
        }
    }

    fn abandon(&self, abandoned: Abandoned) {
        self.counters.abandon(abandoned);
    }
}

/// Commits the handled offsets of `partitions` that moved. `CommitMode::Async` (the
/// periodic commits) sends what moved since the last send and does not wait, so the poll
/// thread never waits on the coordinator; `CommitMode::Sync` (a revocation, the stop)
/// commits what moved since the last confirmed commit and waits for the answer.
fn commit<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &[Arc<Partition>],
    counters: &Counters,
    mode: CommitMode,
) -> Result<(), KafkaError> {
    let mut list = TopicPartitionList::new();
    let mut moved = Vec::new();
    for partition in partitions {
        let offset = match mode {
            CommitMode::Async => partition.to_send(),
            CommitMode::Sync => partition.to_commit(),
        };
        if let Some(offset) = offset {
            list.add_partition_offset(
                &partition.topic,
                partition.partition,
                Offset::Offset(offset),
            )?;
            moved.push((partition, offset));
        }
    }
    if moved.is_empty() {
        return Ok(());
    }
    match consumer.commit(&list, mode) {
        Ok(()) => {
            for (partition, offset) in moved {
                partition.sent.fetch_max(offset, Ordering::Relaxed);
                if matches!(mode, CommitMode::Sync) {
                    partition.committed.store(offset, Ordering::Relaxed);
                }
            }
            Counters::add(&counters.commits);
            Ok(())
        }
        Err(error) => {
            Counters::add(&counters.commit_failures);
            tracing::warn!(%error, "offset commit failed; the next one covers it");
            Err(error)
        }
    }
}

/// The librdkafka context: rebalance callbacks into the books.
struct Context {
    books: Arc<Books>,
}

impl ClientContext for Context {}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(list) => self.books.revoke(consumer, list),
            Rebalance::Assign(_) => {}
            Rebalance::Error(error) => tracing::warn!(%error, "rebalance error"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance {
            self.books.assign(consumer, list);
        }
    }
}

/// The poll thread's state.
struct PollLoop {
    consumer: BaseConsumer<Context>,
    books: Arc<Books>,
    token: CancellationToken,
    control: Arc<Control>,
    commit_interval: Duration,
    stop_budget: Duration,
    max_queued: usize,
    name: String,
    /// The assigned partitions by number, rebuilt when the books' generation moves; only
    /// the poll thread uses it (no lock, no allocation per message).
    routes: std::cell::RefCell<(u64, Routes)>,
    /// Messages taken in one burst of polls, per partition, handed over together.
    pending: std::cell::RefCell<Vec<(Arc<Partition>, Vec<Received>)>>,
}

/// The assigned partitions by partition number (then topic).
type Routes = HashMap<i32, Vec<Arc<Partition>>>;

/// At most this many messages are taken in one burst before they are handed over.
const BURST: usize = 256;

impl PollLoop {
    fn run(self) -> ConsumerReport {
        let mut last_commit = std::time::Instant::now();
        let mut error = None;
        while !self.token.is_cancelled() && !self.control.stop.is_cancelled() {
            if self.books.paused.load(Ordering::Relaxed) > 0 {
                self.resume_drained();
            }
            if last_commit.elapsed() >= self.commit_interval {
                let _ = commit(
                    &self.consumer,
                    &self.assigned(),
                    &self.books.counters,
                    CommitMode::Async,
                );
                last_commit = std::time::Instant::now();
            }
            match self.consumer.poll(POLL_TIMEOUT) {
                Some(Ok(message)) => {
                    self.route(&message);
                    // What else is ready already, without waiting: handed over together.
                    for _ in 1..BURST {
                        match self.consumer.poll(Duration::ZERO) {
                            Some(Ok(message)) => self.route(&message),
                            Some(Err(e)) => {
                                tracing::warn!(consumer = %self.name, error = %e, "consumer error");
                                break;
                            }
                            None => break,
                        }
                    }
                    self.flush();
                }
                Some(Err(e)) => {
                    if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
                        tracing::error!(consumer = %self.name, error = %e, "fatal consumer error: stopping");
                        error = Some(e.to_string());
                        break;
                    }
                    tracing::warn!(consumer = %self.name, error = %e, "consumer error");
                }
                None => {}
            }
        }
        self.finish(error)
    }

    fn assigned(&self) -> Vec<Arc<Partition>> {
        lock(&self.books.partitions).values().cloned().collect()
    }

    /// The partition a message belongs to, if it is assigned to us.
    fn partition_of(&self, topic: &str, number: i32) -> Option<Arc<Partition>> {
        let generation = self.books.generation.load(Ordering::Acquire);
        let mut routes = self.routes.borrow_mut();
        if routes.0 != generation {
            let mut table = Routes::new();
            for partition in lock(&self.books.partitions).values() {
                table
                    .entry(partition.partition)
                    .or_default()
                    .push(Arc::clone(partition));
            }
            *routes = (generation, table);
        }
        routes
            .1
            .get(&number)?
            .iter()
            .find(|p| p.topic == topic)
            .cloned()
    }

    /// Takes a message for its partition's worker, in offset order and once: a message
    /// below the next expected offset was taken already (a resume seeks to the next
    /// expected offset; whatever librdkafka still hands out from before is dropped here).
    fn route(&self, message: &rdkafka::message::BorrowedMessage<'_>) {
        use rdkafka::Message as _;
        let Some(partition) = self.partition_of(message.topic(), message.partition()) else {
            // Not (or no longer) ours: not handled, so not committed by us.
            return;
        };
        let offset = message.offset();
        let next = partition.next.load(Ordering::Relaxed);
        if next >= 0 && offset < next {
            return;
        }
        partition.next.store(offset + 1, Ordering::Relaxed);
        let received = Received::from_kafka(message, Arc::clone(&partition.topic_name));
        let mut pending = self.pending.borrow_mut();
        let at = match pending.iter().position(|(p, _)| Arc::ptr_eq(p, &partition)) {
            Some(at) => at,
            None => {
                pending.push((Arc::clone(&partition), Vec::new()));
                pending.len() - 1
            }
        };
        pending[at].1.push(received);
        // Handed over at once when the queue would reach its limit: the limit holds.
        if partition.queued.load(Ordering::Relaxed) + pending[at].1.len() >= self.max_queued {
            let (partition, messages) = pending.swap_remove(at);
            drop(pending);
            self.hand_over(&partition, messages);
        }
    }

    /// Hands the burst's messages to their workers; pauses a partition whose queue is full.
    fn flush(&self) {
        let pending: Vec<(Arc<Partition>, Vec<Received>)> =
            self.pending.borrow_mut().drain(..).collect();
        for (partition, messages) in pending {
            self.hand_over(&partition, messages);
        }
    }

    fn hand_over(&self, partition: &Arc<Partition>, messages: Vec<Received>) {
        let queued = partition.push(messages);
        // A partition revoked during the burst is not paused: it is not ours any more.
        if queued < self.max_queued
            || partition.stop.is_cancelled()
            || partition.paused.swap(true, Ordering::Relaxed)
        {
            return;
        }
        let mut list = TopicPartitionList::new();
        list.add_partition(&partition.topic, partition.partition);
        match self.consumer.pause(&list) {
            Ok(()) => {
                Counters::add(&self.books.counters.pauses);
                self.books.paused.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                // Not paused: tried again with the next messages.
                partition.paused.store(false, Ordering::Relaxed);
                tracing::warn!(consumer = %self.name, %error, "pausing a full partition failed");
            }
        }
    }

    /// Resumes the paused partitions that drained to half: the resume, then at once (no
    /// poll between them, so no message comes in between) a seek to the next expected
    /// offset, so the fetch restarts exactly after the last message routed, whatever
    /// librdkafka fetched or dropped around the pause (a seek discards what was fetched
    /// before it). A failed seek pauses the partition again, to be retried.
    fn resume_drained(&self) {
        for partition in self.assigned() {
            if !partition.paused.load(Ordering::Relaxed)
                || partition.queued.load(Ordering::Relaxed) > self.max_queued / 2
            {
                continue;
            }
            let mut list = TopicPartitionList::new();
            list.add_partition(&partition.topic, partition.partition);
            if let Err(error) = self.consumer.resume(&list) {
                tracing::warn!(consumer = %self.name, %error, "resume failed; retrying");
                continue;
            }
            let next = partition.next.load(Ordering::Relaxed);
            if next >= 0 {
                let seek = self.consumer.seek(
                    &partition.topic,
                    partition.partition,
                    Offset::Offset(next),
                    Duration::from_secs(5),
                );
                if let Err(error) = seek {
                    tracing::warn!(consumer = %self.name, %error, "seek after a resume failed; pausing again to retry");
                    let _ = self.consumer.pause(&list);
                    continue;
                }
            }
            partition.paused.store(false, Ordering::Relaxed);
            self.books.paused.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The stop: stop fetching, wait for the handlers in flight, commit, leave the group.
    fn finish(self, error: Option<String>) -> ConsumerReport {
        let budget_end = after(self.stop_budget);
        let deadline = || self.control.deadline().unwrap_or(budget_end);
        let partitions: Vec<Arc<Partition>> = lock(&self.books.partitions)
            .drain()
            .map(|(_, p)| p)
            .collect();
        if let Ok(assignment) = self.consumer.assignment() {
            let _ = self.consumer.pause(&assignment);
        }
        for partition in &partitions {
            partition.stop.cancel();
        }
        self.books.wait_for(&partitions, deadline);
        // Handlers of earlier assignments that overran (reported then) get the same time,
        // so that what the caller closes next (a database pool) is not closed under them.
        let earlier: Vec<Arc<Partition>> = lock(&self.books.previous)
            .drain()
            .map(|(_, p)| p)
            .filter(|p| !p.finished.is_set() && !partitions.iter().any(|q| Arc::ptr_eq(p, q)))
            .collect();
        for partition in &earlier {
            partition.finished.wait_until(deadline());
        }
        let unstarted = partitions
            .iter()
            .map(|p| p.queued.load(Ordering::Relaxed) as u64)
            .sum();
        let sync = |partitions: &[Arc<Partition>]| {
            commit(
                &self.consumer,
                partitions,
                &self.books.counters,
                CommitMode::Sync,
            )
        };
        let mut final_commit = sync(&partitions);
        // Retried while the deadline allows (a rebalance in progress fails it for a moment).
        for _ in 0..2 {
            if final_commit.is_ok() || std::time::Instant::now() >= deadline() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
            final_commit = sync(&partitions);
        }
        // Leaving the group: the revocation callback finds no partition left to wait for.
        self.consumer.unsubscribe();
        drop(self.consumer);
        ConsumerReport {
            metrics: self.books.counters.snapshot(),
            abandoned: std::mem::take(&mut *lock(&self.books.counters.abandoned)),
            unstarted,
            final_commit: final_commit.map_err(|e| e.to_string()),
            error,
        }
    }
}
