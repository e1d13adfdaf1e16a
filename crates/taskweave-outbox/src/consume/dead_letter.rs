//! Where messages that failed for good go: [`DeadLetter`], and the headers it adds.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::message::{HandleError, Received};

/// The header of a dead-lettered message that holds the handler's last error.
pub const DEAD_LETTER_ERROR_HEADER: &str = "dead_letter_error";
/// The header of a dead-lettered message that names where it came from:
/// `topic/partition/offset`.
pub const DEAD_LETTER_ORIGIN_HEADER: &str = "dead_letter_origin";
/// The header of a dead-lettered message that holds how many attempts failed.
pub const DEAD_LETTER_ATTEMPTS_HEADER: &str = "dead_letter_attempts";

/// Where messages that failed for good go.
#[derive(Clone)]
pub struct DeadLetter {
    producer: FutureProducer,
    pub(super) topic: String,
}

impl std::fmt::Debug for DeadLetter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetter")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl DeadLetter {
    /// Dead-letters to `topic` through `producer` (for instance
    /// `KafkaPublisher::new(brokers)?.producer()`: idempotent, `acks=all`).
    #[must_use]
    pub fn new(producer: FutureProducer, topic: impl Into<String>) -> Self {
        Self {
            producer,
            topic: topic.into(),
        }
    }

    /// The dead-letter topic.
    #[must_use]
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Sends `message` with its key, payload and headers, plus the error, origin and attempt
    /// headers; waits for the acknowledgement.
    pub(super) async fn send(
        &self,
        message: &Received,
        error: &HandleError,
        attempts: u32,
    ) -> Result<(), KafkaError> {
        let mut headers = OwnedHeaders::new_with_capacity(message.headers().len() + 3);
        for (key, value) in message.headers() {
            headers = headers.insert(Header {
                key,
                value: Some(value.as_slice()),
            });
        }
        let origin = format!(
            "{}/{}/{}",
            message.topic(),
            message.partition(),
            message.offset()
        );
        let attempts = attempts.to_string();
        for (key, value) in [
            (DEAD_LETTER_ERROR_HEADER, error.message()),
            (DEAD_LETTER_ORIGIN_HEADER, origin.as_str()),
            (DEAD_LETTER_ATTEMPTS_HEADER, attempts.as_str()),
        ] {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        let mut record = FutureRecord::<[u8], [u8]>::to(&self.topic).headers(headers);
        if let Some(key) = message.key() {
            record = record.key(key);
        }
        if let Some(payload) = message.payload() {
            record = record.payload(payload);
        }
        self.producer
            .send(record, Duration::from_secs(10))
            .await
            .map(|_| ())
            .map_err(|(error, _)| error)
    }
}
