//! `MemoryPublisher`: records what it is sent, with injectable failures and ack delays.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;

use crate::error::PublishError;
use crate::event::{EVENT_ID_HEADER, EventId, OutboxRecord, SEQUENCE_HEADER};
use crate::publish::Publisher;
use taskweave_supervise::internal::lock;

type Fault = Box<dyn FnMut(&OutboxRecord) -> Option<PublishError> + Send>;
type Delay = Box<dyn FnMut(&OutboxRecord) -> Option<Duration> + Send>;

/// A [`Publisher`] that keeps what it publishes in memory, in publish order, for the tour
/// and for tests on tokio's paused clock. Failures are injected with
/// [`fail_when`](Self::fail_when); acknowledgements can be delayed with
/// [`with_ack_delay`](Self::with_ack_delay). Cheap to clone; clones share the log.
///
/// A record that fails is refused at [`send`](Publisher::send) and is not in the log. One
/// that succeeds is added when it is sent (that is the order a Kafka partition keeps), and
/// acknowledged after the delay.
///
/// # Examples
///
/// ```
/// use taskweave_outbox::{MemoryPublisher, PublishError};
///
/// let publisher = MemoryPublisher::new();
/// publisher.fail_when(|record| {
///     (record.key == b"poison").then(|| PublishError::permanent("message too large"))
/// });
/// assert!(publisher.published().is_empty());
/// ```
#[derive(Clone, Default)]
pub struct MemoryPublisher {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    ack_delay: Duration,
    log: Mutex<Vec<Published>>,
    fault: Mutex<Option<Fault>>,
    ack_fault: Mutex<Option<Fault>>,
    ack_delays: Mutex<Option<Delay>>,
}

/// One record as a [`MemoryPublisher`] published it: what a consumer would read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    /// The topic.
    pub topic: String,
    /// The key.
    pub key: Vec<u8>,
    /// The payload.
    pub payload: Vec<u8>,
    /// Every header, the outbox's two first, then the event's own.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The event id (also in the headers).
    pub event_id: EventId,
    /// The per-key sequence (also in the headers).
    pub sequence: i64,
}

impl MemoryPublisher {
    /// A publisher that acknowledges at once and never fails.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Acknowledges each record `delay` after it was sent (tokio's clock).
    ///
    /// # Panics
    ///
    /// Panics if the publisher has been cloned already (the setting is shared).
    #[must_use]
    pub fn with_ack_delay(mut self, delay: Duration) -> Self {
        Arc::get_mut(&mut self.inner)
            .expect("MemoryPublisher::with_ack_delay: set it before cloning")
            .ack_delay = delay;
        self
    }

    /// From now on, fails each record for which `fault` returns an error (replacing any
    /// earlier rule). `fault` runs under the publisher's lock: keep it short.
    pub fn fail_when(
        &self,
        fault: impl FnMut(&OutboxRecord) -> Option<PublishError> + Send + 'static,
    ) {
        *lock(&self.inner.fault) = Some(Box::new(fault));
    }

    /// From now on, accepts each record for which `fault` returns an error at
    /// [`send`](Publisher::send) but fails its acknowledgement (a broker that times out or
    /// refuses it after it was handed over); it is not in the log. Replaces any earlier
    /// rule of this kind.
    pub fn fail_acks_when(
        &self,
        fault: impl FnMut(&OutboxRecord) -> Option<PublishError> + Send + 'static,
    ) {
        *lock(&self.inner.ack_fault) = Some(Box::new(fault));
    }

    /// From now on, acknowledges each record for which `delay` returns a duration that
    /// long after it was sent, instead of the [usual delay](Self::with_ack_delay): a slow
    /// partition. The record is in the log at once (the broker has it), so a relay that
    /// stops waiting publishes it again. Replaces any earlier rule of this kind.
    pub fn delay_acks_when(
        &self,
        delay: impl FnMut(&OutboxRecord) -> Option<Duration> + Send + 'static,
    ) {
        *lock(&self.inner.ack_delays) = Some(Box::new(delay));
    }

    /// Stops failing and delaying records, at `send` and at acknowledgement.
    pub fn heal(&self) {
        // Dropped outside the lock: it is user code.
        let old = (
            lock(&self.inner.fault).take(),
            lock(&self.inner.ack_fault).take(),
            lock(&self.inner.ack_delays).take(),
        );
        drop(old);
    }

    /// Everything published so far, in publish order.
    #[must_use]
    pub fn published(&self) -> Vec<Published> {
        lock(&self.inner.log).clone()
    }
}

impl fmt::Debug for MemoryPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryPublisher")
            .field("ack_delay", &self.inner.ack_delay)
            .field("published", &lock(&self.inner.log).len())
            .finish_non_exhaustive()
    }
}

impl Publisher for MemoryPublisher {
    type Delivery = BoxFuture<'static, Result<(), PublishError>>;

    async fn send(&self, record: &OutboxRecord) -> Result<Self::Delivery, PublishError> {
        let verdict = lock(&self.inner.fault)
            .as_mut()
            .and_then(|fault| fault(record));
        if let Some(error) = verdict {
            return Err(error);
        }
        let delay = lock(&self.inner.ack_delays)
            .as_mut()
            .and_then(|delay| delay(record))
            .unwrap_or(self.inner.ack_delay);
        let ack_verdict = lock(&self.inner.ack_fault)
            .as_mut()
            .and_then(|fault| fault(record));
        if let Some(error) = ack_verdict {
            return Ok(Box::pin(async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Err(error)
            }));
        }
        let mut headers = vec![
            (
                EVENT_ID_HEADER.to_owned(),
                record.event_id.to_string().into_bytes(),
            ),
            (
                SEQUENCE_HEADER.to_owned(),
                record.sequence.to_string().into_bytes(),
            ),
        ];
        headers.extend(record.headers.iter().cloned());
        lock(&self.inner.log).push(Published {
            topic: record.topic.clone(),
            key: record.key.clone(),
            payload: record.payload.clone(),
            headers,
            event_id: record.event_id,
            sequence: record.sequence,
        });
        Ok(Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Ok(())
        }))
    }
}
