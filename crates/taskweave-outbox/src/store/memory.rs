//! `MemoryStore`: the outbox in one process's memory, with the same claim rules as the
//! PostgreSQL store. For the tour and for paused-clock tests of the relay; it is not
//! durable, so it is not an outbox for production.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::bucket::bucket_of;
use crate::error::{EnqueueError, StoreError};
use crate::event::{Event, EventId, Limits, OutboxRecord};
use crate::nudge::Nudge;
use crate::store::{Batch, ClaimLimits, Store};

/// An in-memory outbox: events are written through a [`MemoryTransaction`] (committed or
/// dropped, like a database transaction) and claimed by relays under the same rules as
/// [`PgStore`](crate::PgStore): disjoint buckets, per-key order, nothing visible before it
/// is committed. Cheap to clone; clones share the events.
///
/// # Examples
///
/// ```
/// use taskweave_outbox::{Event, MemoryStore};
///
/// let store = MemoryStore::new(16);
/// let mut tx = store.begin();
/// tx.enqueue(Event::new("orders", "order-1", b"created".to_vec())).unwrap();
/// assert_eq!(store.pending(), 0); // not committed yet
/// tx.commit();
/// assert_eq!(store.pending(), 1);
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    buckets: u32,
    limits: Limits,
    nudge: Nudge,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_id: i64,
    rows: BTreeMap<i64, Row>,
    // Pending ids per bucket, in id order.
    pending: BTreeMap<u32, BTreeSet<i64>>,
    claimed: HashSet<u32>,
}

struct Row {
    record: OutboxRecord,
    dispatched: bool,
}

impl MemoryStore {
    /// An empty store whose keys hash into `buckets` buckets.
    ///
    /// # Panics
    ///
    /// Panics if `buckets` is zero.
    #[must_use]
    pub fn new(buckets: u32) -> Self {
        assert!(
            buckets > 0,
            "MemoryStore::new: the bucket count must be greater than zero"
        );
        Self {
            inner: Arc::new(Inner {
                buckets,
                limits: Limits::default(),
                nudge: Nudge::new(),
                state: Mutex::new(State {
                    next_id: 1,
                    ..State::default()
                }),
            }),
        }
    }

    /// Sets the limits `enqueue` checks.
    ///
    /// # Panics
    ///
    /// Panics if the store has been cloned already (the limits are shared).
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        Arc::get_mut(&mut self.inner)
            .expect("MemoryStore::with_limits: set the limits before cloning the store")
            .limits = limits;
        self
    }

    /// Opens a transaction: its events become visible together when it commits, and are
    /// gone if it is dropped.
    pub fn begin(&self) -> MemoryTransaction {
        MemoryTransaction {
            store: self.clone(),
            events: Vec::new(),
        }
    }

    /// Enqueues one event in a transaction of its own.
    ///
    /// # Errors
    ///
    /// [`EnqueueError::Invalid`] when the event breaks a [`Limits`] rule; nothing is written.
    pub fn enqueue(&self, event: Event) -> Result<EventId, EnqueueError> {
        let mut tx = self.begin();
        let id = tx.enqueue(event)?;
        tx.commit();
        Ok(id)
    }

    /// Committed events not yet dispatched.
    #[must_use]
    pub fn pending(&self) -> usize {
        self.lock().pending.values().map(BTreeSet::len).sum()
    }

    /// Events dispatched so far.
    #[must_use]
    pub fn dispatched(&self) -> usize {
        self.lock()
            .rows
            .values()
            .filter(|row| row.dispatched)
            .count()
    }

    /// The bucket count.
    #[must_use]
    pub fn buckets(&self) -> u32 {
        self.inner.buckets
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update below leaves the state consistent before anything can panic.
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("buckets", &self.inner.buckets)
            .field("pending", &self.pending())
            .finish_non_exhaustive()
    }
}

/// A write transaction on a [`MemoryStore`]; dropping it without
/// [`commit`](Self::commit) discards its events, like a rollback.
#[must_use = "events are discarded unless the transaction is committed"]
pub struct MemoryTransaction {
    store: MemoryStore,
    events: Vec<(EventId, Event)>,
}

impl MemoryTransaction {
    /// Adds an event to the transaction.
    ///
    /// # Errors
    ///
    /// [`EnqueueError::Invalid`] when the event breaks a [`Limits`] rule; nothing is added.
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
                };
                state.pending.entry(bucket).or_default().insert(id);
                state.rows.insert(
                    id,
                    Row {
                        record,
                        dispatched: false,
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

impl Store for MemoryStore {
    type Batch = MemoryBatch;

    async fn claim(&self, limits: ClaimLimits) -> Result<MemoryBatch, StoreError> {
        let mut state = self.lock();
        let state = &mut *state;
        // Free buckets with pending events, oldest first event first (PgStore's order).
        let mut candidates: Vec<(i64, u32)> = state
            .pending
            .iter()
            .filter(|(bucket, ids)| !ids.is_empty() && !state.claimed.contains(bucket))
            .filter_map(|(&bucket, ids)| ids.first().map(|&first| (first, bucket)))
            .collect();
        candidates.sort_unstable();
        candidates.truncate(limits.buckets as usize);
        let buckets: Vec<u32> = candidates.into_iter().map(|(_, bucket)| bucket).collect();
        let mut ids: Vec<i64> = buckets
            .iter()
            .flat_map(|bucket| {
                state.pending[bucket]
                    .iter()
                    .take(limits.events as usize)
                    .copied()
            })
            .collect();
        ids.sort_unstable();
        ids.truncate(limits.events as usize);
        let records = ids.iter().map(|id| state.rows[id].record.clone()).collect();
        state.claimed.extend(buckets.iter().copied());
        Ok(MemoryBatch {
            store: self.clone(),
            buckets,
            records,
        })
    }

    async fn has_pending(&self) -> Result<bool, StoreError> {
        Ok(self.pending() > 0)
    }

    fn nudge(&self) -> &Nudge {
        &self.inner.nudge
    }
}

/// A batch claimed from a [`MemoryStore`]; dropping it frees its buckets.
pub struct MemoryBatch {
    store: MemoryStore,
    buckets: Vec<u32>,
    records: Vec<OutboxRecord>,
}

impl Batch for MemoryBatch {
    fn records(&self) -> &[OutboxRecord] {
        &self.records
    }

    async fn commit(mut self, dispatched: Vec<i64>) -> Result<(), StoreError> {
        let mut state = self.store.lock();
        for id in dispatched {
            if let Some(row) = state.rows.get_mut(&id) {
                row.dispatched = true;
                let bucket = row.record.bucket;
                if let Some(pending) = state.pending.get_mut(&bucket) {
                    pending.remove(&id);
                }
            }
        }
        for bucket in self.buckets.drain(..) {
            state.claimed.remove(&bucket);
        }
        Ok(())
    }
}

impl Drop for MemoryBatch {
    fn drop(&mut self) {
        if !self.buckets.is_empty() {
            let mut state = self.store.lock();
            for bucket in self.buckets.drain(..) {
                state.claimed.remove(&bucket);
            }
        }
    }
}

impl fmt::Debug for MemoryBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBatch")
            .field("buckets", &self.buckets)
            .field("records", &self.records.len())
            .finish()
    }
}
