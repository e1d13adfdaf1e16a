//! What a handler gets (`Received`), what it returns (`HandleError`), and the `Handler` trait.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::event::{EVENT_ID_HEADER, SEQUENCE_HEADER};

/// A message taken from Kafka, owned, cheap to clone (the data is shared).
#[derive(Clone)]
pub struct Received {
    inner: Arc<Inner>,
}

struct Inner {
    topic: Arc<str>,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
    timestamp: Option<i64>,
}

impl Received {
    /// A message built by hand: for handler unit tests, and for code that replays messages.
    #[must_use]
    pub fn new(
        topic: impl Into<String>,
        partition: i32,
        offset: i64,
        key: Option<Vec<u8>>,
        payload: Option<Vec<u8>>,
        headers: Vec<(String, Vec<u8>)>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                topic: Arc::from(topic.into()),
                partition,
                offset,
                key,
                payload,
                headers,
                timestamp: None,
            }),
        }
    }

    #[cfg(feature = "kafka")]
    pub(crate) fn from_kafka<M: rdkafka::Message>(message: &M, topic: Arc<str>) -> Self {
        use rdkafka::message::Headers;
        let headers = message
            .headers()
            .map(|all| {
                all.iter()
                    .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            inner: Arc::new(Inner {
                topic,
                partition: message.partition(),
                offset: message.offset(),
                key: message.key().map(<[u8]>::to_vec),
                payload: message.payload().map(<[u8]>::to_vec),
                headers,
                timestamp: message.timestamp().to_millis(),
            }),
        }
    }

    /// The topic it came from.
    #[must_use]
    pub fn topic(&self) -> &str {
        &self.inner.topic
    }

    /// Its partition.
    #[must_use]
    pub fn partition(&self) -> i32 {
        self.inner.partition
    }

    /// Its offset in the partition.
    #[must_use]
    pub fn offset(&self) -> i64 {
        self.inner.offset
    }

    /// Its key, if it has one.
    #[must_use]
    pub fn key(&self) -> Option<&[u8]> {
        self.inner.key.as_deref()
    }

    /// Its payload (`None` for a tombstone).
    #[must_use]
    pub fn payload(&self) -> Option<&[u8]> {
        self.inner.payload.as_deref()
    }

    /// Its headers, in order (a header without a value has an empty one).
    #[must_use]
    pub fn headers(&self) -> &[(String, Vec<u8>)] {
        &self.inner.headers
    }

    /// The first header named `name`.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.inner
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The message's timestamp, in milliseconds since the Unix epoch, when it has one.
    #[must_use]
    pub fn timestamp_millis(&self) -> Option<i64> {
        self.inner.timestamp
    }

    /// The [`EVENT_ID_HEADER`] as text, when present and UTF-8: the outbox's UUIDv7, or any
    /// producer's unique id.
    #[must_use]
    pub fn event_id(&self) -> Option<&str> {
        self.header(EVENT_ID_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok())
            .filter(|id| !id.is_empty())
    }

    /// The [`SEQUENCE_HEADER`] as a number, when present and well-formed: the per-key
    /// sequence the outbox sends (higher is newer).
    #[must_use]
    pub fn sequence(&self) -> Option<i64> {
        self.header(SEQUENCE_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|s| s.parse().ok())
    }
}

impl fmt::Debug for Received {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Received")
            .field("topic", &self.inner.topic)
            .field("partition", &self.inner.partition)
            .field("offset", &self.inner.offset)
            .field(
                "key",
                &self.inner.key.as_deref().map(String::from_utf8_lossy),
            )
            .field("payload_len", &self.inner.payload.as_ref().map(Vec::len))
            .field("headers", &self.inner.headers.len())
            .finish()
    }
}

/// Why a handler did not handle a message.
///
/// A *retriable* failure is retried with backoff (the consumer's
/// [`RetryPolicy`](crate::RetryPolicy)); a *permanent* one (a message that can never be
/// handled: it does not parse, it breaks a rule) goes to the dead-letter topic at once. Any
/// `std::error::Error` converts into a retriable one, so `?` works in handlers.
#[derive(Clone, PartialEq, Eq)]
pub struct HandleError {
    message: String,
    permanent: bool,
}

impl HandleError {
    /// A failure worth retrying (a database that is down, a timeout).
    #[must_use]
    pub fn retriable(message: impl fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            permanent: false,
        }
    }

    /// A failure that retrying cannot fix: the message goes to the dead-letter topic at once.
    #[must_use]
    pub fn permanent(message: impl fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            permanent: true,
        }
    }

    /// The error's text (sent in the dead-letter header).
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether retrying is pointless.
    #[must_use]
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }
}

impl<E: std::error::Error> From<E> for HandleError {
    fn from(error: E) -> Self {
        Self::retriable(error)
    }
}

impl fmt::Debug for HandleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.permanent {
            "permanent"
        } else {
            "retriable"
        };
        write!(f, "HandleError({kind}: {:?})", self.message)
    }
}

impl fmt::Display for HandleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Handles one message. The consumer calls it for the messages of one partition one at a
/// time, in offset order, and for different partitions concurrently.
///
/// A closure `Fn(Received) -> impl Future<Output = Result<(), HandleError>>` is a handler.
/// A handler may panic: that counts as a failed attempt, with the panic's message.
///
/// The future is never dropped halfway by the consumer: it runs to its end even when a stop
/// or a rebalance gives up waiting for it (its offset is then not committed, and the
/// message is delivered again). So a handler may hold a database transaction across its
/// awaits without the risk of a commit cut in the middle.
pub trait Handler: Send + Sync + 'static {
    /// Handles `message`.
    fn handle(&self, message: Received) -> impl Future<Output = Result<(), HandleError>> + Send;
}

impl<F, Fut> Handler for F
where
    F: Fn(Received) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandleError>> + Send,
{
    fn handle(&self, message: Received) -> impl Future<Output = Result<(), HandleError>> + Send {
        self(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_outbox_headers() {
        let message = Received::new(
            "t",
            0,
            7,
            Some(b"k".to_vec()),
            Some(b"{}".to_vec()),
            vec![
                (EVENT_ID_HEADER.to_owned(), b"0190-abc".to_vec()),
                (SEQUENCE_HEADER.to_owned(), b"42".to_vec()),
            ],
        );
        assert_eq!(message.event_id(), Some("0190-abc"));
        assert_eq!(message.sequence(), Some(42));
        let bare = Received::new(
            "t",
            0,
            7,
            None,
            None,
            vec![(SEQUENCE_HEADER.to_owned(), b"x".to_vec())],
        );
        assert_eq!(bare.event_id(), None);
        assert_eq!(bare.sequence(), None);
    }

    #[test]
    fn errors_convert_and_classify() {
        let parse: HandleError = "x".parse::<i32>().unwrap_err().into();
        assert!(!parse.is_permanent());
        assert!(HandleError::permanent("bad").is_permanent());
        assert_eq!(HandleError::permanent("bad").to_string(), "bad");
    }
}
