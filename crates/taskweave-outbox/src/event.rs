//! What the application enqueues ([`Event`]) and what the relay reads back ([`OutboxRecord`]).

use std::fmt;

use uuid::Uuid;

use crate::error::InvalidEvent;

/// The Kafka header that carries an event's [`EventId`] (its UUID in text form), for
/// consumers that drop duplicates.
pub const EVENT_ID_HEADER: &str = "event_id";

/// The Kafka header that carries an event's per-key sequence (a decimal `i64`): the caller's
/// aggregate version when one was given, else the outbox id, which grows with commit order
/// for each key.
///
/// Drop duplicates by [`EVENT_ID_HEADER`]: a redelivery carries the id of an event already
/// applied. The sequence tells a consumer where an event stands in its key's history: one
/// that applies whole-state snapshots can keep the highest sequence per key and ignore
/// anything lower. Do not drop events that merely arrive with a lower sequence when they
/// carry changes (deltas): in the one case the relay counts in
/// [`RelayMetrics::sent_after_failure`](crate::RelayMetrics::sent_after_failure), a key's
/// earlier event is first delivered after a later one, and dropping it would lose it.
pub const SEQUENCE_HEADER: &str = "event_seq";

/// The unique id of an enqueued event: a UUIDv7 made in the application at `enqueue`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(Uuid);

impl EventId {
    /// A new time-ordered (version 7) id.
    #[must_use]
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }

    /// Wraps an existing UUID (for instance one read back from a header).
    #[must_use]
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The UUID.
    #[must_use]
    pub const fn as_uuid(&self) -> &Uuid {
        &self.0
    }
}

impl Default for EventId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventId({})", self.0)
    }
}

/// An event to publish: a topic, a key (events of one key are published in commit order), a
/// payload and headers, and optionally the caller's own per-key sequence.
///
/// # Examples
///
/// ```
/// use taskweave_outbox::Event;
///
/// let event = Event::new("order-events", "order-42", br#"{"status":"created"}"#.to_vec())
///     .with_header("content-type", "application/json")
///     .with_sequence(1);
/// assert_eq!(event.topic(), "order-events");
/// assert_eq!(event.key(), b"order-42");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Event {
    pub(crate) topic: String,
    pub(crate) key: Vec<u8>,
    pub(crate) payload: Vec<u8>,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    pub(crate) sequence: Option<i64>,
}

impl Event {
    /// An event for `topic` with Kafka key `key`. Nothing is checked here; [`Limits`]
    /// are checked by `enqueue`, which returns a typed error and writes nothing.
    pub fn new(
        topic: impl Into<String>,
        key: impl Into<Vec<u8>>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            topic: topic.into(),
            key: key.into(),
            payload: payload.into(),
            headers: Vec::new(),
            sequence: None,
        }
    }

    /// Adds a Kafka header (names may repeat; order is kept). The names
    /// [`EVENT_ID_HEADER`] and [`SEQUENCE_HEADER`] are the outbox's own and are refused by
    /// `enqueue`.
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets the per-key sequence sent in [`SEQUENCE_HEADER`] (an aggregate version, say).
    /// Without it the outbox id is sent, which grows with commit order for each key.
    #[must_use]
    pub fn with_sequence(mut self, sequence: i64) -> Self {
        self.sequence = Some(sequence);
        self
    }

    /// The topic.
    #[must_use]
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The key.
    #[must_use]
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The payload.
    #[must_use]
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The headers, in the order they were added.
    #[must_use]
    pub fn headers(&self) -> &[(String, Vec<u8>)] {
        &self.headers
    }

    /// The caller's sequence, if one was set.
    #[must_use]
    pub fn sequence(&self) -> Option<i64> {
        self.sequence
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("topic", &self.topic)
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("payload_len", &self.payload.len())
            .field("headers", &self.headers.len())
            .field("sequence", &self.sequence)
            .finish()
    }
}

/// The most header bytes the store's encoding holds (lengths are 32-bit).
const MAX_ENCODED_HEADER_BYTES: usize = u32::MAX as usize;

/// Size limits checked at `enqueue`, before anything is written.
///
/// The defaults follow Kafka's: a topic name of at most 249 characters from
/// `[a-zA-Z0-9._-]`, a payload of at most 900 KiB, a key of at most 1 KiB, at most 64
/// headers whose names and values come to at most 32 KiB. Together (955,392 bytes) they
/// leave room for the outbox's own two headers and the record's framing under librdkafka's
/// default `message.max.bytes` (1,000,000 bytes, which counts the key, the payload and the
/// headers): an event that passes `enqueue` with the default limits is never refused as too
/// large by a default producer. Raise them only together with the producer's and the
/// broker's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest payload, in bytes.
    pub max_payload_bytes: usize,
    /// The longest key, in bytes.
    pub max_key_bytes: usize,
    /// The most headers on one event.
    pub max_headers: usize,
    /// The most bytes of header names and values on one event, all headers together (the
    /// store encodes header lengths in 32 bits, so a limit above `u32::MAX` counts as
    /// `u32::MAX`).
    pub max_header_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_payload_bytes: 900 * 1024,
            max_key_bytes: 1024,
            max_headers: 64,
            max_header_bytes: 32 * 1024,
        }
    }
}

impl Limits {
    /// Checks `event` against these limits and Kafka's topic-name rule.
    ///
    /// # Errors
    ///
    /// The first rule the event breaks.
    pub fn check(&self, event: &Event) -> Result<(), InvalidEvent> {
        if event.topic.is_empty() {
            return Err(InvalidEvent::EmptyTopic);
        }
        if event.topic.len() > 249
            || event.topic == "."
            || event.topic == ".."
            || !event
                .topic
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(InvalidEvent::InvalidTopic(event.topic.clone()));
        }
        if event.key.is_empty() {
            return Err(InvalidEvent::EmptyKey);
        }
        if event.key.len() > self.max_key_bytes {
            return Err(InvalidEvent::KeyTooLong {
                len: event.key.len(),
                limit: self.max_key_bytes,
            });
        }
        if event.payload.len() > self.max_payload_bytes {
            return Err(InvalidEvent::PayloadTooLarge {
                len: event.payload.len(),
                limit: self.max_payload_bytes,
            });
        }
        if event.headers.len() > self.max_headers {
            return Err(InvalidEvent::TooManyHeaders {
                count: event.headers.len(),
                limit: self.max_headers,
            });
        }
        let mut header_bytes = 0_usize;
        for (name, value) in &event.headers {
            if name.is_empty() {
                return Err(InvalidEvent::EmptyHeaderName);
            }
            if name == EVENT_ID_HEADER || name == SEQUENCE_HEADER {
                return Err(InvalidEvent::ReservedHeader(name.clone()));
            }
            header_bytes = header_bytes
                .saturating_add(name.len())
                .saturating_add(value.len());
        }
        // Every name is at least a byte, so within this bound the count fits in 32 bits too.
        let limit = self.max_header_bytes.min(MAX_ENCODED_HEADER_BYTES);
        if header_bytes > limit {
            return Err(InvalidEvent::HeadersTooLarge {
                len: header_bytes,
                limit,
            });
        }
        Ok(())
    }
}

/// An event as the relay reads it back from the store: the event plus its outbox id, its
/// bucket and its [`EventId`].
#[derive(Clone, PartialEq, Eq)]
pub struct OutboxRecord {
    /// The outbox id: grows with commit order for each key.
    pub id: i64,
    /// The event's unique id, sent in [`EVENT_ID_HEADER`].
    pub event_id: EventId,
    /// The bucket the key hashes into.
    pub bucket: u32,
    /// The topic.
    pub topic: String,
    /// The Kafka key.
    pub key: Vec<u8>,
    /// The payload.
    pub payload: Vec<u8>,
    /// The caller's headers (the outbox adds its own two when publishing).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The per-key sequence sent in [`SEQUENCE_HEADER`]: the caller's, or the outbox id.
    pub sequence: i64,
    /// Failed publish attempts so far (0 for an event never tried, or retried by an
    /// operator).
    pub attempts: u32,
}

impl fmt::Debug for OutboxRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxRecord")
            .field("id", &self.id)
            .field("event_id", &self.event_id)
            .field("bucket", &self.bucket)
            .field("topic", &self.topic)
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("payload_len", &self.payload.len())
            .field("sequence", &self.sequence)
            .finish_non_exhaustive()
    }
}
