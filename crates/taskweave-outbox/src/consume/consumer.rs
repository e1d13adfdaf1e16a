//! The consumer's builder: [`Consumer`], its settings, and `start`, which joins the group
//! and starts the poll thread.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use tokio::sync::{Semaphore, oneshot};
use tokio_util::sync::CancellationToken;

use super::control::Control;
use super::dead_letter::DeadLetter;
use super::error::ConsumeError;
use super::message::Handler;
use super::partition::{self, Counters, Workers};
use super::poll::PollLoop;
use super::rebalance::{Books, Context};
use super::report::ConsumerReport;
use super::running::RunningConsumer;
use crate::retry::RetryPolicy;

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
///   the event id (or the [`Inbox`](crate::consume::Inbox)) to make that harmless.
/// - **Failures**: a handler's error or panic is retried with backoff
///   ([`with_retry`](Self::with_retry), per message); after the last attempt, or at once
///   for a [permanent](crate::consume::HandleError::permanent) error, the message goes to
///   the dead-letter topic ([`with_dead_letter`](Self::with_dead_letter)) with the error in
///   [`DEAD_LETTER_ERROR_HEADER`](crate::consume::DEAD_LETTER_ERROR_HEADER), and the
///   partition moves on. With no dead-letter topic,
///   the partition keeps retrying the message at the policy's cap (between half the
///   [longest delay](crate::RetryPolicy::with_max_delay) and all of it, with jitter),
///   from its first failure for good on: nothing is skipped silently.
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

/// The longest startup timeout librdkafka takes.
const MAX_STARTUP_TIMEOUT: Duration = crate::publish::LIBRDKAFKA_MAX_TIMEOUT;

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

    /// A consumer with your own settings. Keep `enable.auto.commit=false` and
    /// `enable.auto.offset.store=false` (start from [`config`](Self::config)): librdkafka
    /// stores each offset as the message is fetched, and an automatic commit (on its timer,
    /// or of a revoked partition) would commit messages fetched but not yet handled, which
    /// the next owner then skips. [`start`](Self::start) refuses a configuration that does
    /// not set both to `false`.
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

    /// How long [`start`](Self::start) waits for the brokers' answer (default 10 s; at most
    /// `i32::MAX` milliseconds, about 24.8 days, librdkafka's limit: a longer one counts as
    /// that).
    #[must_use]
    pub fn with_startup_timeout(mut self, timeout: Duration) -> Self {
        // rdkafka converts the timeout to an `i32` of milliseconds with `as`, which wraps.
        self.startup_timeout = timeout.min(MAX_STARTUP_TIMEOUT);
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
        // librdkafka's defaults are `true` for both: unset counts as on.
        for setting in ["enable.auto.commit", "enable.auto.offset.store"] {
            if !self
                .config
                .get(setting)
                .is_some_and(|value| value.eq_ignore_ascii_case("false"))
            {
                return Err(ConsumeError::Invalid(format!(
                    "Consumer: {setting} must be false (the consumer commits what it has handled; \
                     an automatic commit would commit messages fetched but not yet handled): \
                     start from Consumer::config"
                )));
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_startup_timeout_past_librdkafkas_range_counts_as_its_longest() {
        let consumer = Consumer::new("127.0.0.1:1", "g", ["t"]);
        let far = consumer.with_startup_timeout(Duration::from_secs(30 * 24 * 3600));
        assert_eq!(far.startup_timeout, MAX_STARTUP_TIMEOUT);
        assert!(i32::try_from(far.startup_timeout.as_millis()).is_ok());
        let near =
            Consumer::new("127.0.0.1:1", "g", ["t"]).with_startup_timeout(Duration::from_secs(3));
        assert_eq!(near.startup_timeout, Duration::from_secs(3));
    }
}
