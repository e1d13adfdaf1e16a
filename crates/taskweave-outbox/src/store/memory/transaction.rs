//! A write transaction on a [`MemoryStore`](super::MemoryStore): [`MemoryTransaction`],
//! whose events become visible together when it commits.

use std::fmt;
use std::time::SystemTime;

use tokio::time::Instant;

use super::{MemoryStore, Row};
use crate::bucket::bucket_of;
use crate::error::EnqueueError;
use crate::event::{Event, EventId, OutboxRecord};

/// A write transaction on a [`MemoryStore`]; dropping it without
/// [`commit`](Self::commit) discards its events, like a rollback.
#[must_use = "events are discarded unless the transaction is committed"]
pub struct MemoryTransaction {
    pub(super) store: MemoryStore,
    pub(super) events: Vec<(EventId, Event)>,
}

impl MemoryTransaction {
    /// Adds an event to the transaction.
    ///
    /// # Errors
    ///
    /// [`EnqueueError::Invalid`] when the event breaks a [`Limits`](crate::Limits) rule;
    /// nothing is added.
    pub fn enqueue(&mut self, event: Event) -> Result<EventId, EnqueueError> {
        self.store
            .inner
            .limits
            .check(&event)
            .map_err(|reason| EnqueueError::Invalid { index: 0, reason })?;
        let id = EventId::new();
        self.events.push((id, event));
        Ok(id)
    }

    /// Makes the events visible to relays, in the order they were enqueued, and nudges the
    /// store's relays.
    pub fn commit(self) {
        let store = self.store;
        let buckets = store.inner.buckets;
        let created = (Instant::now(), SystemTime::now());
        {
            let mut state = store.lock();
            for (event_id, event) in self.events {
                let id = state.next_id;
                state.next_id += 1;
                let bucket = bucket_of(&event.key, buckets);
                let record = OutboxRecord {
                    id,
                    event_id,
                    bucket,
                    sequence: event.sequence.unwrap_or(id),
                    topic: event.topic,
                    key: event.key,
                    payload: event.payload,
                    headers: event.headers,
                    attempts: 0,
                };
                state.pending.entry(bucket).or_default().insert(id);
                state.rows.insert(
                    id,
                    Row {
                        record,
                        created,
                        dispatched: None,
                        next_attempt: None,
                        last_error: None,
                        parked: None,
                    },
                );
            }
        }
        store.inner.nudge.notify();
    }
}

impl fmt::Debug for MemoryTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTransaction")
            .field("events", &self.events.len())
            .finish_non_exhaustive()
    }
}
