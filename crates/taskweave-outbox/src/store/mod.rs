//! Where events wait: the [`Store`] trait the relay claims batches from, its PostgreSQL
//! implementation (the product) and an in-memory one (the tour, paused-clock tests).

use std::future::Future;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::error::StoreError;
use crate::event::{EventId, OutboxRecord};
use crate::nudge::Nudge;
use crate::retry::FailedAttempt;

mod memory;
#[cfg(feature = "postgres")]
mod postgres;

pub use memory::{MemoryBatch, MemoryStore, MemoryTransaction};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{PgBatch, PgStore, Schema, migrate, migrate_up_to};
// The inbox (the consuming end, with `kafka`) runs its transactions through it too.
#[cfg(all(feature = "postgres", feature = "kafka"))]
pub(crate) use postgres::Guarded;

/// What a relay may claim in one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimLimits {
    /// At most this many buckets, those whose oldest pending event is oldest first.
    pub buckets: u32,
    /// At most this many events, in id order, from the claimed buckets.
    pub events: u32,
    /// The longest the batch will be held open: a store may cut off a batch held longer
    /// (the PostgreSQL store sets the session's statement and idle-in-transaction timeouts
    /// from it).
    pub hold_at_most: Duration,
}

/// How many waiting events of a key [`Store::release_held_back`] releases in one step.
pub(crate) const RELEASE_STEP: u32 = 10_000;

/// Counts of what waits in a store (see [`Store::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Events waiting to be published: ready, backing off after a failure, or behind an
    /// earlier event of their key that backs off. Parked events and those behind them are
    /// not counted here.
    pub pending: u64,
    /// Of `pending`: events whose last attempt failed and whose next attempt is not due yet.
    pub backing_off: u64,
    /// Parked events: failed for good (or too often), waiting for an operator.
    pub parked: u64,
    /// Events behind a parked event of their key: they wait for it to be retried or purged.
    pub behind_parked: u64,
    /// The age of the oldest of `pending` (the relay's lag), or `None` when nothing is
    /// pending.
    pub oldest_pending_age: Option<Duration>,
}

/// A parked event, as [`Store::parked`] lists it for an operator.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParkedEvent {
    /// The outbox id (what [`Store::retry_parked`] and [`Store::purge_parked`] take).
    pub id: i64,
    /// The event's id (its `event_id` header).
    pub event_id: EventId,
    /// The topic.
    pub topic: String,
    /// The key.
    pub key: Vec<u8>,
    /// Failed attempts.
    pub attempts: u32,
    /// The last attempt's error.
    pub last_error: Option<String>,
    /// When it was written.
    pub created_at: SystemTime,
    /// When it was parked.
    pub parked_at: SystemTime,
}

/// The storage a relay reads from.
///
/// The contract every implementation keeps (one shared test suite checks both):
/// - a claim takes buckets that no other open batch holds, and only buckets with claimable
///   events; for each claimed bucket, the events are a prefix (in id order) of its
///   claimable events, and the batch's records are in id order;
/// - an event is claimable when it is pending and no event of its key up to it is
///   *held*: parked, or backing off (its next attempt not yet due). A held key holds back
///   only its own events; the other keys of its bucket stay claimable;
/// - ids grow with commit order for each key, and only committed events are seen;
/// - completing a batch marks the given ids dispatched, records the failed attempts, and
///   frees its buckets in one step; dropping a batch without completing it (a crash) frees
///   its buckets and changes nothing.
///
/// Besides what the relay needs, the trait carries what an operator runs: [`stats`](Self::stats),
/// the parked events ([`parked`](Self::parked), [`retry_parked`](Self::retry_parked),
/// [`retry_parked_key`](Self::retry_parked_key), [`purge_parked`](Self::purge_parked)) and
/// retention ([`delete_dispatched`](Self::delete_dispatched), run periodically by
/// [`Retention`](crate::Retention)).
///
/// # Parked events: what to run after fixing the cause
///
/// ```
/// use taskweave_outbox::{Event, MemoryPublisher, MemoryStore, PublishError, Relay, Store};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let store = MemoryStore::new(16);
/// store.enqueue(Event::new("orders", "order-1", b"x".repeat(100))).unwrap();
/// let publisher = MemoryPublisher::new();
/// publisher.fail_when(|record| {
///     (record.payload.len() > 10).then(|| PublishError::permanent("message too large"))
/// });
/// let token = CancellationToken::new();
/// let relay = tokio::spawn(Relay::new(store.clone(), publisher.clone()).run(token.clone()));
/// tokio::time::sleep(std::time::Duration::from_secs(1)).await;
///
/// // A permanent error parks the event at once; list what is parked and why.
/// let parked = store.parked(100).await.unwrap();
/// assert_eq!(parked.len(), 1);
/// assert!(parked[0].last_error.as_deref().unwrap().contains("too large"));
///
/// // The cause is fixed (here: the topic's size limit was raised): retry it.
/// publisher.heal();
/// assert!(store.retry_parked(parked[0].id).await.unwrap());
/// tokio::time::sleep(std::time::Duration::from_secs(1)).await;
/// assert_eq!(publisher.published().len(), 1);
/// token.cancel();
/// relay.await.unwrap();
/// # }
/// ```
pub trait Store: Send + Sync + 'static {
    /// An open batch: the claimed buckets, held until it is committed or dropped.
    type Batch: Batch;

    /// Claims buckets and reads their pending events.
    ///
    /// # Errors
    ///
    /// The store's failure; nothing is held then.
    ///
    /// # Cancel safety
    ///
    /// Required: the relay drops this future when it outlasts its share of the batch
    /// budget. Dropped at any point, it must hold nothing (no bucket claimed, no connection
    /// left inside a transaction). The PostgreSQL store closes a connection dropped inside
    /// its transaction, so the server rolls it back and frees the buckets.
    fn claim(
        &self,
        limits: ClaimLimits,
    ) -> impl Future<Output = Result<Self::Batch, StoreError>> + Send;

    /// Whether any committed event could be published within `within` from now: claimable
    /// now, held by a batch, or backing off with its next attempt (and its key's earlier
    /// ones) due within `within`. Parked events, those behind them, and retries due later do
    /// not count: a [`drain`](crate::Relay::drain) waits for a retry due before its
    /// deadline, never for one due after it.
    ///
    /// # Errors
    ///
    /// The store's failure.
    ///
    /// # Cancel safety
    ///
    /// Required: the relay drops this future when it outlasts its bound (a share of the
    /// batch budget, a drain's deadline). A read; dropped, it changes nothing.
    fn has_pending(
        &self,
        within: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Counts of what waits, and the lag. For PostgreSQL, one query over the pending
    /// partial index: its cost follows the pending rows, never the dispatched ones kept.
    ///
    /// # Errors
    ///
    /// The store's failure.
    ///
    /// # Cancel safety
    ///
    /// Required: the relay drops this future when it outlasts its bound and when it stops.
    /// A read; dropped, it changes nothing.
    fn stats(&self) -> impl Future<Output = Result<OutboxStats, StoreError>> + Send;

    /// Up to `limit` parked events, oldest first.
    ///
    /// # Errors
    ///
    /// The store's failure.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a read.
    fn parked(
        &self,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<ParkedEvent>, StoreError>> + Send;

    /// Un-parks event `id`: its attempt count starts again from zero and it is claimable at
    /// once, followed by its key's later events. Returns whether it was parked.
    ///
    /// # Errors
    ///
    /// The store's failure.
    ///
    /// # Cancel safety
    ///
    /// Dropped, the event is un-parked whole or not at all (one statement for the
    /// PostgreSQL store; the release of its key's waiting events that follows is redone by
    /// the relay's next [`release_held_back`](Self::release_held_back)).
    fn retry_parked(&self, id: i64) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Un-parks every parked event of `key` (of any topic); returns how many.
    ///
    /// # Errors
    ///
    /// The store's failure.
    ///
    /// # Cancel safety
    ///
    /// As [`retry_parked`](Self::retry_parked).
    fn retry_parked_key(&self, key: &[u8]) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Deletes parked event `id` for good: it is never published, and its key's later
    /// events flow. Returns whether it was parked (an event that is not parked is never
    /// deleted).
    ///
    /// # Errors
    ///
    /// The store's failure.
    ///
    /// # Cancel safety
    ///
    /// As [`retry_parked`](Self::retry_parked).
    fn purge_parked(&self, id: i64) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Keeps the events behind held keys out of the claim's way: makes claimable again up to
    /// `limit` events in all (each key's oldest first) that waited behind a failed event
    /// that is gone (dispatched, retried or purged), and takes out those written since
    /// behind a key held long; returns how many it made claimable again. Bounded by `limit`
    /// however many keys recovered, so that each call makes progress: call it again while
    /// it returns more than zero.
    /// The relay calls it after a batch that delivered an event that had failed, and at
    /// least every second; a store that keeps no such state (the in-memory one) does
    /// nothing.
    ///
    /// The PostgreSQL store takes the events behind a failed event held long (parked, or
    /// its next attempt 10 s away or more) out of the index the claim reads (they *wait*),
    /// so a claim never walks a held key's backlog, however long; this puts them back,
    /// oldest first.
    ///
    /// # Errors
    ///
    /// The store's failure.
    ///
    /// # Cancel safety
    ///
    /// Required: the relay drops this future when it outlasts its bound. Each step is
    /// whole or not at all (the PostgreSQL store runs each in a transaction of its own and
    /// closes a connection dropped inside one); the relay calls it again.
    fn release_held_back(
        &self,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let _ = limit;
        async { Ok(0) }
    }

    /// Deletes up to `limit` dispatched events dispatched more than `older_than` ago,
    /// oldest dispatch first; returns how many. Never touches a pending or parked event.
    /// One bounded statement: call it in a loop (as [`Retention`](crate::Retention) does)
    /// rather than with a huge limit, so that no cleanup holds long locks or writes a burst
    /// of WAL.
    ///
    /// # Errors
    ///
    /// The store's failure.
    ///
    /// # Cancel safety
    ///
    /// Dropped, the deletion happens whole or not at all (one statement for the PostgreSQL
    /// store).
    fn delete_dispatched(
        &self,
        older_than: Duration,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// The nudge local writers send after a commit.
    fn nudge(&self) -> &Nudge;

    /// A wake-up across processes, if the store has one: a future that nudges
    /// [`nudge`](Self::nudge) whenever another process commits events, until `token` is
    /// cancelled. A relay spawns it for as long as it runs. The default has none.
    fn wake_ups(&self, token: CancellationToken) -> Option<BoxFuture<'static, ()>> {
        let _ = token;
        None
    }
}

/// A claimed batch; see [`Store`].
pub trait Batch: Send {
    /// The claimed events, in id order.
    fn records(&self) -> &[OutboxRecord];

    /// Marks `dispatched` (ids from [`records`](Self::records)) dispatched, records each
    /// of `failed` (its attempt count goes up by one, its error is kept, and it backs off
    /// or is parked), and frees the buckets, atomically. With nothing to record it only
    /// frees the buckets.
    ///
    /// # Errors
    ///
    /// The store's failure: then nothing was recorded (the batch's events stay pending and
    /// are published again: duplicates, never a loss).
    ///
    /// # Cancel safety
    ///
    /// Implementations must leave the store consistent when the future is dropped (the
    /// PostgreSQL store closes the connection, so the server rolls the batch back), but
    /// the relay never drops it: a commit is never cut off halfway.
    fn complete(
        self,
        dispatched: Vec<i64>,
        failed: Vec<FailedAttempt>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// [`complete`](Self::complete) with no failed attempts.
    ///
    /// # Errors
    ///
    /// As [`complete`](Self::complete).
    ///
    /// # Cancel safety
    ///
    /// As [`complete`](Self::complete).
    fn commit(self, dispatched: Vec<i64>) -> impl Future<Output = Result<(), StoreError>> + Send
    where
        Self: Sized,
    {
        self.complete(dispatched, Vec::new())
    }
}
