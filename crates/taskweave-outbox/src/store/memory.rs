//! `MemoryStore`: the outbox in one process's memory, with the same claim rules as the
//! PostgreSQL store. For the tour and for paused-clock tests of the relay; it is not
//! durable, so it is not an outbox for production.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::bucket::bucket_of;
use crate::error::{EnqueueError, StoreError};
use crate::event::{Event, EventId, Limits, OutboxRecord};
use crate::nudge::Nudge;
use crate::retry::{FailedAttempt, NextAttempt};
use crate::store::{Batch, ClaimLimits, OutboxStats, ParkedEvent, Store};

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
    created: (Instant, SystemTime),
    dispatched: Option<Instant>,
    /// When the next attempt is due, after a failed one.
    next_attempt: Option<Instant>,
    last_error: Option<String>,
    parked: Option<SystemTime>,
}

impl Row {
    /// Whether it holds back its key at `now`: parked, or backing off.
    fn holds(&self, now: Instant) -> bool {
        self.parked.is_some() || self.next_attempt.is_some_and(|due| due > now)
    }
}

impl State {
    /// The claimable pending ids of `bucket` at `now`, in id order: a key stops at its
    /// first held row.
    fn claimable(&self, bucket: u32, now: Instant) -> impl Iterator<Item = i64> + '_ {
        let mut held: HashSet<&[u8]> = HashSet::new();
        self.pending
            .get(&bucket)
            .into_iter()
            .flatten()
            .filter(move |id| {
                let row = &self.rows[*id];
                let key = row.record.key.as_slice();
                if held.contains(key) {
                    return false;
                }
                if row.holds(now) {
                    held.insert(key);
                    return false;
                }
                true
            })
            .copied()
    }
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

    /// Events dispatched so far (and not yet deleted by retention).
    #[must_use]
    pub fn dispatched(&self) -> usize {
        self.lock()
            .rows
            .values()
            .filter(|row| row.dispatched.is_some())
            .count()
    }

    /// The bucket count.
    #[must_use]
    pub fn buckets(&self) -> u32 {
        self.inner.buckets
    }

    fn stats_now(&self) -> OutboxStats {
        let now = Instant::now();
        let state = self.lock();
        let mut stats = OutboxStats::default();
        let mut oldest: Option<Instant> = None;
        for ids in state.pending.values() {
            let mut parked_keys: HashSet<&[u8]> = HashSet::new();
            for id in ids {
                let row = &state.rows[id];
                let key = row.record.key.as_slice();
                if row.parked.is_some() {
                    stats.parked += 1;
                    parked_keys.insert(key);
                } else if parked_keys.contains(key) {
                    stats.behind_parked += 1;
                } else {
                    stats.pending += 1;
                    if row.next_attempt.is_some_and(|due| due > now) {
                        stats.backing_off += 1;
                    }
                    oldest = Some(oldest.map_or(row.created.0, |o| o.min(row.created.0)));
                }
            }
        }
        stats.oldest_pending_age = oldest.map(|created| now.saturating_duration_since(created));
        stats
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

/// Makes a parked row claimable again, its attempts counted from zero.
fn unpark(row: &mut Row) {
    row.parked = None;
    row.next_attempt = None;
    row.record.attempts = 0;
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

impl Store for MemoryStore {
    type Batch = MemoryBatch;

    async fn claim(&self, limits: ClaimLimits) -> Result<MemoryBatch, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;
        // Free buckets with claimable events, oldest first claimable event first (PgStore's
        // order).
        let mut candidates: Vec<(i64, u32)> = state
            .pending
            .keys()
            .filter(|bucket| !state.claimed.contains(bucket))
            .filter_map(|&bucket| {
                state
                    .claimable(bucket, now)
                    .next()
                    .map(|first| (first, bucket))
            })
            .collect();
        candidates.sort_unstable();
        candidates.truncate(limits.buckets as usize);
        let buckets: Vec<u32> = candidates.into_iter().map(|(_, bucket)| bucket).collect();
        let mut ids: Vec<i64> = buckets
            .iter()
            .flat_map(|&bucket| state.claimable(bucket, now).take(limits.events as usize))
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

    async fn has_pending(&self, within: Duration) -> Result<bool, StoreError> {
        let horizon = far_or(Instant::now(), within);
        let state = self.lock();
        // A key counts up to its first row held beyond the horizon.
        let found = state
            .pending
            .keys()
            .any(|&bucket| state.claimable(bucket, horizon).next().is_some());
        Ok(found)
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        Ok(self.stats_now())
    }

    async fn parked(&self, limit: u32) -> Result<Vec<ParkedEvent>, StoreError> {
        let state = self.lock();
        let mut parked: Vec<ParkedEvent> = state
            .pending
            .values()
            .flatten()
            .filter_map(|id| {
                let row = &state.rows[id];
                row.parked.map(|parked_at| ParkedEvent {
                    id: *id,
                    event_id: row.record.event_id,
                    topic: row.record.topic.clone(),
                    key: row.record.key.clone(),
                    attempts: row.record.attempts,
                    last_error: row.last_error.clone(),
                    created_at: row.created.1,
                    parked_at,
                })
            })
            .collect();
        parked.sort_unstable_by_key(|event| event.id);
        parked.truncate(limit as usize);
        Ok(parked)
    }

    async fn retry_parked(&self, id: i64) -> Result<bool, StoreError> {
        let retried = {
            let mut state = self.lock();
            state.rows.get_mut(&id).is_some_and(|row| {
                let parked = row.parked.is_some() && row.dispatched.is_none();
                if parked {
                    unpark(row);
                }
                parked
            })
        };
        if retried {
            self.inner.nudge.notify();
        }
        Ok(retried)
    }

    async fn retry_parked_key(&self, key: &[u8]) -> Result<u64, StoreError> {
        let bucket = bucket_of(key, self.inner.buckets);
        let retried = {
            let mut state = self.lock();
            let state = &mut *state;
            let mut retried = 0;
            for id in state.pending.get(&bucket).into_iter().flatten() {
                if let Some(row) = state.rows.get_mut(id)
                    && row.record.key == key
                    && row.parked.is_some()
                {
                    unpark(row);
                    retried += 1;
                }
            }
            retried
        };
        if retried > 0 {
            self.inner.nudge.notify();
        }
        Ok(retried)
    }

    async fn purge_parked(&self, id: i64) -> Result<bool, StoreError> {
        let purged = {
            let mut state = self.lock();
            let parked = state
                .rows
                .get(&id)
                .is_some_and(|row| row.parked.is_some() && row.dispatched.is_none());
            if parked
                && let Some(row) = state.rows.remove(&id)
                && let Some(pending) = state.pending.get_mut(&row.record.bucket)
            {
                pending.remove(&id);
            }
            parked
        };
        if purged {
            self.inner.nudge.notify();
        }
        Ok(purged)
    }

    async fn delete_dispatched(&self, older_than: Duration, limit: u32) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let mut old: Vec<(Instant, i64)> = state
            .rows
            .iter()
            .filter_map(|(id, row)| row.dispatched.map(|at| (at, *id)))
            .filter(|(at, _)| now.saturating_duration_since(*at) > older_than)
            .collect();
        old.sort_unstable();
        old.truncate(limit as usize);
        for (_, id) in &old {
            state.rows.remove(id);
        }
        Ok(old.len() as u64)
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

    async fn complete(
        mut self,
        dispatched: Vec<i64>,
        failed: Vec<FailedAttempt>,
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut state = self.store.lock();
        for id in dispatched {
            if let Some(row) = state.rows.get_mut(&id)
                && row.dispatched.is_none()
            {
                row.dispatched = Some(now);
                let bucket = row.record.bucket;
                if let Some(pending) = state.pending.get_mut(&bucket) {
                    pending.remove(&id);
                }
            }
        }
        for failure in failed {
            if let Some(row) = state.rows.get_mut(&failure.id)
                && row.dispatched.is_none()
            {
                row.record.attempts = row.record.attempts.saturating_add(1);
                row.last_error = Some(failure.error);
                match failure.next {
                    NextAttempt::After(delay) => {
                        row.next_attempt = Some(far_or(now, delay));
                    }
                    NextAttempt::Park => {
                        row.next_attempt = None;
                        row.parked = Some(SystemTime::now());
                    }
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

/// `now + delay`, or, past the clock's range, a time far enough to mean never.
fn far_or(now: Instant, delay: Duration) -> Instant {
    now.checked_add(delay)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
}
