//! `KafkaPublisher`: the relay's publisher on rdkafka's `FutureProducer`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};

use crate::error::PublishError;
use crate::event::{EVENT_ID_HEADER, OutboxRecord, SEQUENCE_HEADER};
use crate::publish::Publisher;

/// How long `send` waits between tries while librdkafka's local queue is full.
const QUEUE_FULL_BACKOFF: Duration = Duration::from_millis(2);

/// The longest timeout librdkafka takes (a flush, a consumer's startup): `i32::MAX`
/// milliseconds, about 24.8 days (rdkafka converts a longer one with a wrapping `as`).
pub(crate) const LIBRDKAFKA_MAX_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// Publishes outbox records to Kafka with an idempotent producer.
///
/// [`KafkaPublisher::config`] gives the settings the outbox's guarantees rest on, and
/// [`KafkaPublisher::new`] uses them as they are:
///
/// | setting | value | why |
/// |---|---|---|
/// | `enable.idempotence` | `true` | retries neither duplicate nor reorder a partition |
/// | `acks` | `all` | an acknowledgement means the in-sync replicas have it |
/// | `partitioner` | `murmur2_random` | keys land on the partitions the Java client picks |
/// | `message.timeout.ms` | `5000` | a delivery report always comes back within 80 % of the relay's default 10 s batch budget |
/// | `topic.metadata.propagation.max.ms` | `2000` | a topic that does not exist fails as unknown (permanent: the event is parked) instead of timing out (retriable: retried for minutes); a topic created less than 2 s ago may be reported unknown, so create topics before enqueueing to them |
///
/// The Kafka key is the event's key; the headers are [`EVENT_ID_HEADER`],
/// [`SEQUENCE_HEADER`], then the event's own.
///
/// # A producer that goes silent
///
/// An idempotent producer whose state the cluster lost (a broker restarted without its
/// logs; measured here with tansu's memory storage) times out every message from then on,
/// while a new producer on the same brokers gets through at once. When the relay reports
/// several batches in a row that delivered nothing and timed out, the publisher
/// ([`Publisher::recover`]) replaces its producer with a new one from the same settings,
/// if the old one is at least 5 s old. Every `send` then waits until the old producer has
/// nothing in flight (its records delivered or timed out, within `message.timeout.ms`)
/// before it hands a record to the new one, so no message of the old producer can land
/// after one of the new, also when clones of the publisher are used by other relays.
/// The new producer has a new producer id: a message the old one sent and the broker kept
/// but never acknowledged is then published twice, which at-least-once delivery allows and
/// the event id lets consumers drop.
///
/// # Examples
///
/// ```no_run
/// use taskweave_outbox::KafkaPublisher;
///
/// # fn demo() -> Result<(), rdkafka::error::KafkaError> {
/// let publisher = KafkaPublisher::new("127.0.0.1:9092")?;
/// // Or adjust the settings first:
/// let mut config = KafkaPublisher::config("127.0.0.1:9092");
/// config.set("linger.ms", "1");
/// let publisher = KafkaPublisher::from_config(&config)?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct KafkaPublisher {
    config: ClientConfig,
    /// The current producer, replaced by `recover`; shared by clones.
    current: Arc<Mutex<Current>>,
}

/// The producer in use and, after a `recover`, the one it replaced until that one has
/// nothing in flight: no record goes to the new producer while the old one may still
/// deliver one (which would reorder a key).
struct Current {
    producer: FutureProducer,
    made: std::time::Instant,
    previous: Option<FutureProducer>,
}

/// The least age of a producer before `recover` replaces it (two relays sharing one
/// publisher both asking must not replace a producer nobody has tried).
const RECOVER_AFTER: Duration = Duration::from_secs(5);

/// How long `send` waits between looks while a replaced producer still has records in flight.
const DRAIN_BACKOFF: Duration = Duration::from_millis(2);

impl KafkaPublisher {
    /// A publisher with [`config(brokers)`](Self::config).
    ///
    /// # Errors
    ///
    /// librdkafka's refusal of the configuration.
    pub fn new(brokers: &str) -> Result<Self, KafkaError> {
        Self::from_config(&Self::config(brokers))
    }

    /// The settings the outbox's guarantees rest on (see the type's docs), for
    /// `bootstrap.servers = brokers`.
    #[must_use]
    pub fn config(brokers: &str) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("partitioner", "murmur2_random")
            .set("message.timeout.ms", "5000")
            .set("topic.metadata.propagation.max.ms", "2000");
        config
    }

    /// A publisher with your own settings. Keep `enable.idempotence=true` for per-key
    /// order under retries, and `message.timeout.ms` below 80 % of the relay's batch budget.
    ///
    /// # Errors
    ///
    /// librdkafka's refusal of the configuration.
    pub fn from_config(config: &ClientConfig) -> Result<Self, KafkaError> {
        Ok(Self {
            config: config.clone(),
            current: Arc::new(Mutex::new(Current {
                producer: config.create()?,
                made: std::time::Instant::now(),
                previous: None,
            })),
        })
    }

    /// The current producer (a cheap handle), to share with code that publishes directly.
    /// After a [`recover`](Publisher::recover) the publisher uses a new one.
    pub fn producer(&self) -> FutureProducer {
        self.lock().producer.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands `message` to the current producer, under the lock a `recover` swaps the
    /// producer under (`send_result` only enqueues, it never blocks): a send made before a
    /// swap is on the old producer before the new one exists, and one made after waits
    /// until the old one has nothing in flight. So no message of the old producer lands
    /// after one of the new. `Wait` hands the message back while the old one drains.
    fn send_now<'a>(&self, message: Message<'a>) -> SendNow<'a> {
        let mut current = self.lock();
        if current
            .previous
            .as_ref()
            .is_some_and(|previous| previous.in_flight_count() > 0)
        {
            return SendNow::Wait(message);
        }
        let retired = current.previous.take();
        let sent = current.producer.send_result(message);
        drop(current);
        if let Some(retired) = retired {
            retire(retired);
        }
        SendNow::Sent(sent)
    }
}

type Message<'a> = FutureRecord<'a, [u8], [u8]>;

/// What [`KafkaPublisher::send_now`] did with a message.
enum SendNow<'a> {
    Sent(Result<DeliveryFuture, (KafkaError, Message<'a>)>),
    Wait(Message<'a>),
}

/// Drops a producer off the async threads: librdkafka's destroy blocks its thread.
fn retire(producer: FutureProducer) {
    drop(tokio::task::spawn_blocking(move || drop(producer)));
}

impl fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("in_flight", &self.producer().in_flight_count())
            .finish_non_exhaustive()
    }
}

impl Publisher for KafkaPublisher {
    type Delivery = KafkaDelivery;

    async fn send(&self, record: &OutboxRecord) -> Result<KafkaDelivery, PublishError> {
        let event_id = record.event_id.to_string();
        let sequence = record.sequence.to_string();
        let mut headers = OwnedHeaders::new_with_capacity(2 + record.headers.len())
            .insert(Header {
                key: EVENT_ID_HEADER,
                value: Some(event_id.as_bytes()),
            })
            .insert(Header {
                key: SEQUENCE_HEADER,
                value: Some(sequence.as_bytes()),
            });
        for (name, value) in &record.headers {
            headers = headers.insert(Header {
                key: name.as_str(),
                value: Some(value.as_slice()),
            });
        }
        let mut message: Message<'_> = FutureRecord::to(&record.topic)
            .key(record.key.as_slice())
            .payload(record.payload.as_slice())
            .headers(headers);
        loop {
            match self.send_now(message) {
                SendNow::Sent(Ok(delivery)) => return Ok(KafkaDelivery { inner: delivery }),
                SendNow::Sent(Err((
                    KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull),
                    back,
                ))) => {
                    // The local queue drains as acknowledgements come in; the relay bounds
                    // the wait with its batch budget.
                    message = back;
                    tokio::time::sleep(QUEUE_FULL_BACKOFF).await;
                }
                SendNow::Sent(Err((error, _))) => return Err(classify(&error)),
                // A replaced producer still has records in flight. Bounded by its
                // `message.timeout.ms`, and by the relay's publish deadline.
                SendNow::Wait(back) => {
                    message = back;
                    tokio::time::sleep(DRAIN_BACKOFF).await;
                }
            }
        }
    }

    async fn flush(&self, timeout: Duration) -> Result<(), PublishError> {
        // A replaced producer still draining holds records handed over too.
        let (producer, previous) = {
            let current = self.lock();
            (current.producer.clone(), current.previous.clone())
        };
        // librdkafka's flush blocks its thread.
        tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + timeout.min(LIBRDKAFKA_MAX_TIMEOUT);
            if let Some(previous) = previous {
                previous.flush(deadline.saturating_duration_since(std::time::Instant::now()))?;
            }
            producer.flush(deadline.saturating_duration_since(std::time::Instant::now()))
        })
        .await
        .map_err(|error| PublishError::retriable(format!("flush task failed: {error}")))?
        .map_err(|error| classify(&error))
    }

    async fn recover(&self) -> bool {
        {
            let current = self.lock();
            // Records still in flight on it are fine: sends wait for them (see `Current`).
            if current.previous.is_some() || current.made.elapsed() < RECOVER_AFTER {
                return false;
            }
        }
        // Made outside the lock (it starts librdkafka's threads), swapped in under it after
        // the same checks again.
        let fresh: FutureProducer = match self.config.create() {
            Ok(fresh) => fresh,
            Err(error) => {
                tracing::warn!(%error, "outbox publisher could not make a new Kafka producer");
                return false;
            }
        };
        let mut current = self.lock();
        if current.previous.is_some() || current.made.elapsed() < RECOVER_AFTER {
            drop(current);
            retire(fresh);
            return false;
        }
        // The old one stays until it has nothing in flight (a send of a clone may have
        // raced this): no send goes to the new one before then.
        let old = std::mem::replace(&mut current.producer, fresh);
        current.previous = Some(old);
        current.made = std::time::Instant::now();
        drop(current);
        tracing::warn!(
            "outbox publisher replaced its Kafka producer after batches that delivered nothing"
        );
        true
    }
}

/// The acknowledgement of one record sent by [`KafkaPublisher`].
#[must_use = "futures do nothing unless polled"]
pub struct KafkaDelivery {
    inner: DeliveryFuture,
}

impl Future for KafkaDelivery {
    type Output = Result<(), PublishError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.inner)
            .poll(cx)
            .map(|result| match result {
                Ok(Ok(_delivery)) => Ok(()),
                Ok(Err((error, _message))) => Err(classify(&error)),
                Err(_canceled) => Err(PublishError::retriable(
                    "the producer dropped the delivery report",
                )),
            })
    }
}

impl fmt::Debug for KafkaDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaDelivery").finish_non_exhaustive()
    }
}

/// Permanent: the record or the topic is wrong, or we may not write; waiting will not help.
/// Everything else (timeouts, leader changes, brokers down) is worth retrying.
fn classify(error: &KafkaError) -> PublishError {
    // With idempotence a fatal error (an unrecoverable sequence gap, a fenced producer)
    // makes the producer refuse everything from then on.
    if matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::Fatal)) {
        return PublishError::fatal(error.to_string());
    }
    let permanent = matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownPartition
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::PolicyViolation
                | RDKafkaErrorCode::InvalidArgument
        )
    );
    if permanent {
        PublishError::permanent(error.to_string())
    } else {
        PublishError::retriable(error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::PublishErrorKind;

    fn kind(code: RDKafkaErrorCode) -> PublishErrorKind {
        classify(&KafkaError::MessageProduction(code)).kind()
    }

    #[test]
    fn errors_are_classified_by_their_code() {
        use RDKafkaErrorCode as C;
        for code in [
            C::BrokerTransportFailure,
            C::AllBrokersDown,
            C::MessageTimedOut,
            C::RequestTimedOut,
            C::LeaderNotAvailable,
            C::NotLeaderForPartition,
            C::NotEnoughReplicas,
            C::NotEnoughReplicasAfterAppend,
            C::NetworkException,
            C::QueueFull,
        ] {
            assert_eq!(kind(code), PublishErrorKind::Retriable, "{code:?}");
        }
        for code in [
            C::MessageSizeTooLarge,
            C::InvalidMessageSize,
            C::InvalidRecord,
            C::InvalidTopic,
            C::UnknownTopic,
            C::UnknownTopicOrPartition,
            C::TopicAuthorizationFailed,
            C::ClusterAuthorizationFailed,
            C::PolicyViolation,
        ] {
            assert_eq!(kind(code), PublishErrorKind::Permanent, "{code:?}");
        }
        assert_eq!(kind(C::Fatal), PublishErrorKind::Fatal);
    }
}
