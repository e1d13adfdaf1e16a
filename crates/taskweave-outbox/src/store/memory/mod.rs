//! `MemoryStore`: the outbox in one process's memory, with the same claim rules as the
//! PostgreSQL store. For the tour and for paused-clock tests of the relay; it is not
//! durable, so it is not an outbox for production.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::error::EnqueueError;
use crate::event::{Event, EventId, Limits, OutboxRecord};
use crate::nudge::Nudge;
use crate::store::OutboxStats;

mod batch;
mod store_impl;
mod transaction;

pub use batch::MemoryBatch;
pub use transaction::MemoryTransaction;

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
        taskweave_supervise::internal::lock(&self.inner.state)
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

/// `now + delay`, or, past the clock's range, a time far enough to mean never.
fn far_or(now: Instant, delay: Duration) -> Instant {
    now.checked_add(delay)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
}
