//! Where events go: the [`Publisher`] trait, the Kafka implementation on rdkafka (the
//! product) and an in-memory one (the tour, paused-clock tests).

use std::future::Future;
use std::time::Duration;

use crate::error::PublishError;
use crate::event::OutboxRecord;

#[cfg(feature = "kafka")]
mod kafka;
mod memory;

#[cfg(feature = "kafka")]
pub(crate) use kafka::LIBRDKAFKA_MAX_TIMEOUT;
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub use kafka::{KafkaDelivery, KafkaPublisher};
pub use memory::{MemoryPublisher, Published};

/// A transport the relay publishes to, in two steps: [`send`](Self::send) hands a record
/// over (waiting only for room in the transport's queue) and returns a future of its
/// acknowledgement, so a batch is sent in one go and its acknowledgements awaited together.
///
/// The relay calls `send` one record at a time, in id order, and never sends a key's record
/// after an earlier record of that key failed in `send`. An implementation keeps the order
/// of sends for records of one key (Kafka does, per partition, with the idempotent producer)
/// and adds the headers [`EVENT_ID_HEADER`](crate::EVENT_ID_HEADER) and
/// [`SEQUENCE_HEADER`](crate::SEQUENCE_HEADER).
pub trait Publisher: Send + Sync + 'static {
    /// The acknowledgement of one record.
    type Delivery: Future<Output = Result<(), PublishError>> + Send + 'static;

    /// Hands `record` over for publishing.
    ///
    /// # Errors
    ///
    /// A failure known before anything was sent (the record is too large, the topic is
    /// unknown); the relay leaves the record pending.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a future dropped before it completes has not handed the record over.
    fn send(
        &self,
        record: &OutboxRecord,
    ) -> impl Future<Output = Result<Self::Delivery, PublishError>> + Send;

    /// Waits up to `timeout` for every record handed over to be acknowledged or failed:
    /// call it before closing the process (the Kafka producer's flush).
    ///
    /// # Errors
    ///
    /// When records are still in flight at the timeout.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; the records stay in flight.
    fn flush(&self, timeout: Duration) -> impl Future<Output = Result<(), PublishError>> + Send {
        let _ = timeout;
        async { Ok(()) }
    }

    /// Called by the relay when several batches in a row delivered nothing and timed out
    /// (see [`Relay`](crate::Relay)): a chance to replace a transport that has gone silent.
    /// Returns whether it did. The relay calls it only between batches, with none of its
    /// deliveries outstanding. The default does nothing.
    ///
    /// # Cancel safety
    ///
    /// Implementations must leave the publisher usable when the future is dropped.
    fn recover(&self) -> impl Future<Output = bool> + Send {
        async { false }
    }
}
