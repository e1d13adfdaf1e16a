//! The outbox's errors: a refused event, a store (database) failure, a publish failure.

use std::error::Error;
use std::fmt;

/// Why `enqueue` refused an event. Nothing was written.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidEvent {
    /// The topic is empty.
    EmptyTopic,
    /// The topic is longer than 249 bytes, is `.` or `..`, or has a character outside
    /// `[a-zA-Z0-9._-]` (Kafka's rule).
    InvalidTopic(String),
    /// The key is empty: per-key order needs a key.
    EmptyKey,
    /// The key is longer than [`Limits::max_key_bytes`](crate::Limits::max_key_bytes).
    KeyTooLong {
        /// The key's length in bytes.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The payload is larger than
    /// [`Limits::max_payload_bytes`](crate::Limits::max_payload_bytes).
    PayloadTooLarge {
        /// The payload's length in bytes.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// More headers than [`Limits::max_headers`](crate::Limits::max_headers).
    TooManyHeaders {
        /// How many the event has.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The header names and values together are larger than
    /// [`Limits::max_header_bytes`](crate::Limits::max_header_bytes).
    HeadersTooLarge {
        /// The bytes of the event's header names and values.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A header has an empty name.
    EmptyHeaderName,
    /// A header uses a name the outbox sets itself
    /// ([`EVENT_ID_HEADER`](crate::EVENT_ID_HEADER), [`SEQUENCE_HEADER`](crate::SEQUENCE_HEADER)).
    ReservedHeader(String),
}

impl fmt::Display for InvalidEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyTopic => f.write_str("empty topic"),
            Self::InvalidTopic(topic) => write!(f, "invalid topic name {topic:?}"),
            Self::EmptyKey => f.write_str("empty key"),
            Self::KeyTooLong { len, limit } => {
                write!(f, "key of {len} bytes over the limit of {limit}")
            }
            Self::PayloadTooLarge { len, limit } => {
                write!(f, "payload of {len} bytes over the limit of {limit}")
            }
            Self::TooManyHeaders { count, limit } => {
                write!(f, "{count} headers over the limit of {limit}")
            }
            Self::HeadersTooLarge { len, limit } => {
                write!(f, "headers of {len} bytes over the limit of {limit}")
            }
            Self::EmptyHeaderName => f.write_str("empty header name"),
            Self::ReservedHeader(name) => {
                write!(f, "header name {name:?} is reserved by the outbox")
            }
        }
    }
}

impl Error for InvalidEvent {}

/// The error of `enqueue`.
#[derive(Debug)]
#[non_exhaustive]
pub enum EnqueueError {
    /// The event breaks a rule; nothing was written. For a batch, `index` is its position.
    Invalid {
        /// The position of the refused event in what was enqueued (0 for a single event).
        index: usize,
        /// The rule it breaks.
        reason: InvalidEvent,
    },
    /// The database refused the write. The caller's transaction is then aborted in
    /// PostgreSQL's eyes: roll it back.
    Store(StoreError),
}

impl fmt::Display for EnqueueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid { index, reason } => write!(f, "event {index} refused: {reason}"),
            Self::Store(_) => f.write_str("outbox write failed"),
        }
    }
}

impl Error for EnqueueError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Invalid { reason, .. } => Some(reason),
            Self::Store(error) => Some(error),
        }
    }
}

impl From<StoreError> for EnqueueError {
    fn from(error: StoreError) -> Self {
        Self::Store(error)
    }
}

/// A failure of the store: the database, or what it holds.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// The database driver's error.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Database(sqlx::Error),
    /// The outbox tables are missing or older than this crate: run
    /// [`migrate`](crate::migrate) first.
    NotMigrated(String),
    /// The tables were created with another bucket count than the one asked for.
    BucketCountMismatch {
        /// The count stored in the database.
        stored: u32,
        /// The count asked for.
        requested: u32,
    },
    /// The database was migrated by a newer version of this crate.
    NewerSchema {
        /// The version found.
        found: i32,
        /// The newest version this crate knows.
        known: i32,
    },
    /// A stored row could not be read back.
    Corrupt(String),
    /// The store did not answer within the relay's share of the batch budget.
    TimedOut(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            #[cfg(feature = "postgres")]
            Self::Database(_) => f.write_str("database error"),
            Self::NotMigrated(what) => write!(f, "outbox schema not migrated: {what}"),
            Self::BucketCountMismatch { stored, requested } => write!(
                f,
                "outbox was migrated with {stored} buckets, {requested} requested"
            ),
            Self::NewerSchema { found, known } => write!(
                f,
                "outbox schema version {found} is newer than this crate's {known}"
            ),
            Self::Corrupt(what) => write!(f, "corrupt outbox row: {what}"),
            Self::TimedOut(what) => write!(f, "outbox store timed out {what}"),
        }
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            #[cfg(feature = "postgres")]
            Self::Database(error) => Some(error),
            _ => None,
        }
    }
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        Self::Database(error)
    }
}

/// How a publish failure should be treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PublishErrorKind {
    /// It may work later (broker unavailable, leader change, a timeout).
    Retriable,
    /// It will not work without a change (message too large, unknown topic, authorization).
    Permanent,
    /// The publisher itself is broken for good (the Kafka producer raised a fatal error):
    /// nothing more goes through it, and the relay stops.
    Fatal,
}

/// A record that was not published; the relay leaves it pending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishError {
    kind: PublishErrorKind,
    message: String,
}

impl PublishError {
    /// A failure that may go away by itself.
    pub fn retriable(message: impl Into<String>) -> Self {
        Self {
            kind: PublishErrorKind::Retriable,
            message: message.into(),
        }
    }

    /// A failure that needs a change before a retry can work.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            kind: PublishErrorKind::Permanent,
            message: message.into(),
        }
    }

    /// The publisher is broken for good; see [`PublishErrorKind::Fatal`].
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            kind: PublishErrorKind::Fatal,
            message: message.into(),
        }
    }

    /// Whether it is worth retrying.
    #[must_use]
    pub fn kind(&self) -> PublishErrorKind {
        self.kind
    }

    /// What the publisher said.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            PublishErrorKind::Retriable => "retriable",
            PublishErrorKind::Permanent => "permanent",
            PublishErrorKind::Fatal => "fatal",
        };
        write!(f, "publish failed ({kind}): {}", self.message)
    }
}

impl Error for PublishError {}
