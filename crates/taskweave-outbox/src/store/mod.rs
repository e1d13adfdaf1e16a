//! Where events wait: the [`Store`] trait the relay claims batches from, its PostgreSQL
//! implementation (the product) and an in-memory one (the tour, paused-clock tests).

use std::future::Future;
use std::time::Duration;

use crate::error::StoreError;
use crate::event::OutboxRecord;
use crate::nudge::Nudge;

mod memory;
#[cfg(feature = "postgres")]
mod postgres;

pub use memory::{MemoryBatch, MemoryStore, MemoryTransaction};
#[cfg(feature = "postgres")]
pub use postgres::{PgBatch, PgStore, Schema, migrate};

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

/// The storage a relay reads from.
///
/// The contract every implementation keeps (one shared test suite checks both):
/// - a claim takes buckets that no other open batch holds, and only buckets with pending
///   events; for each claimed bucket, the events are a prefix (in id order) of its pending
///   events, and the batch's records are in id order;
/// - ids grow with commit order for each key, and only committed events are seen;
/// - committing a batch marks the given ids dispatched and frees its buckets in one step;
///   dropping a batch without committing (a crash) frees its buckets and changes nothing.
pub trait Store: Send + Sync + 'static {
    /// An open batch: the claimed buckets, held until it is committed or dropped.
    type Batch: Batch;

    /// Claims buckets and reads their pending events.
    ///
    /// # Errors
    ///
    /// The store's failure; nothing is held then.
    fn claim(
        &self,
        limits: ClaimLimits,
    ) -> impl Future<Output = Result<Self::Batch, StoreError>> + Send;

    /// Whether any committed event is not yet dispatched (claimable or held by a batch).
    ///
    /// # Errors
    ///
    /// The store's failure.
    fn has_pending(&self) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The nudge local writers send after a commit.
    fn nudge(&self) -> &Nudge;
}

/// A claimed batch; see [`Store`].
pub trait Batch: Send {
    /// The claimed events, in id order.
    fn records(&self) -> &[OutboxRecord];

    /// Marks `dispatched` (ids from [`records`](Self::records)) dispatched and frees the
    /// buckets, atomically. With no ids it only frees the buckets.
    ///
    /// # Errors
    ///
    /// The store's failure: then nothing was marked (the batch's events stay pending and
    /// are published again: duplicates, never a loss).
    ///
    /// # Cancel safety
    ///
    /// Implementations must leave the store consistent when the future is dropped (the
    /// PostgreSQL store closes the connection, so the server rolls the batch back), but
    /// the relay never drops it: a commit is never cut off halfway.
    fn commit(self, dispatched: Vec<i64>) -> impl Future<Output = Result<(), StoreError>> + Send;
}
