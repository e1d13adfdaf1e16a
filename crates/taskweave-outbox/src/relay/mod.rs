//! The relay: claims batches from a [`Store`], publishes them, marks what was delivered.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use taskweave_shutdown::Shutdown;

use crate::publish::Publisher;
use crate::retry::RetryPolicy;
use crate::store::Store;

mod batch;
pub mod hooks;
mod metrics;
mod report;
mod run;

pub use metrics::{RelayMetrics, RelayMetricsHandle};
pub use report::{BatchSummary, RelayReport, StopReason};

use metrics::Counters;

/// The share of the batch budget by whose end every acknowledgement must be in (the claim
/// included); the rest is the commit's.
const PUBLISH_SHARE: f64 = 0.8;

/// The share of the batch budget the claim may take.
const CLAIM_SHARE: f64 = 0.1;

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
    ///
    /// # Panics
    ///
    /// Panics if `interval` is `Some` zero (the count would run back to back).
    #[must_use]
    pub fn with_stats_interval(mut self, interval: Option<Duration>) -> Self {
        assert!(
            interval.is_none_or(|every| !every.is_zero()),
            "Relay::with_stats_interval: the interval must be greater than zero (None: never)"
        );
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
