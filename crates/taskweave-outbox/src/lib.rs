//! A transactional outbox on tokio: write an event in the same PostgreSQL transaction as
//! the business data, and let relays publish it to Kafka, at least once, in per-key order,
//! with any number of relays on any number of machines.
//!
//! - [`migrate`] creates the tables (an events table with a partial index on the pending
//!   rows, and a small bucket table), idempotently, in a schema and with a table prefix of
//!   your choice ([`Schema`]).
//! - [`PgStore::enqueue`] / [`PgStore::enqueue_batch`] write [`Event`]s on the caller's
//!   `&mut PgConnection` (a transaction), each with a UUIDv7 [`EventId`] and a per-key
//!   sequence that travel as Kafka headers ([`EVENT_ID_HEADER`], [`SEQUENCE_HEADER`]) so
//!   consumers can drop duplicates and stale redeliveries.
//! - A [`Relay`] claims key buckets with `FOR UPDATE SKIP LOCKED`, publishes their events
//!   through a [`Publisher`] ([`KafkaPublisher`] on rdkafka), awaits every
//!   acknowledgement, marks the delivered events dispatched and commits; one batch, one
//!   transaction, never cut off halfway. `run(token)` stops between batches;
//!   `drain(token, deadline)` starts no batch that cannot finish before the deadline.
//! - A failed publish backs off its key only ([`RetryPolicy`]: exponential, with jitter,
//!   stored on the row); after too many attempts, or at once for a permanent error, the
//!   event is *parked*, and [`Store::parked`], [`Store::retry_parked`] and
//!   [`Store::purge_parked`] are what an operator runs after fixing the cause. Every
//!   other key flows meanwhile, including the keys that share the failing key's bucket.
//! - [`Retention`] deletes dispatched events after an age, in bounded batches, on a
//!   [`taskweave_periodic`] schedule; [`Store::stats`] gives the pending count and the lag
//!   in one cheap query; [`PgStore::with_notify`] wakes relays across processes with
//!   `LISTEN`/`NOTIFY`.
//! - [`consume`] is the consuming end: [`consume::Consumer`] runs a handler per message,
//!   in order per partition and in parallel across partitions, commits offsets only after
//!   handling, retries and dead-letters failures, hands partitions over cleanly at
//!   rebalances and stops within a deadline; [`consume::Inbox`] records each event id in
//!   the handler's own transaction, so a redelivered event changes nothing.
//! - [`MemoryStore`] and [`MemoryPublisher`] keep the same rules in memory, for the tour
//!   and paused-clock tests; one test suite runs against both stores.
//!
//! Features: `postgres` ([`PgStore`], [`migrate`]; sqlx) and `kafka` ([`KafkaPublisher`];
//! rdkafka, which builds librdkafka from source), both on by default.
//!
//! # Example
//!
//! The relay's loop on the in-memory store and publisher; with PostgreSQL and Kafka only
//! the two constructors change (see [`PgStore`] and [`KafkaPublisher`]).
//!
//! ```
//! use std::time::Duration;
//! use taskweave_outbox::{Event, MemoryPublisher, MemoryStore, Relay, SEQUENCE_HEADER};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let store = MemoryStore::new(64);
//! let publisher = MemoryPublisher::new();
//! let token = CancellationToken::new();
//! let relay = tokio::spawn(Relay::new(store.clone(), publisher.clone()).run(token.clone()));
//!
//! // The business transaction: the order and its event commit together.
//! let mut tx = store.begin();
//! tx.enqueue(Event::new("order-events", "order-7", b"created".to_vec())).unwrap();
//! tx.enqueue(Event::new("order-events", "order-7", b"paid".to_vec())).unwrap();
//! tx.commit(); // nudges the relay: no wait for the poll interval
//!
//! tokio::time::sleep(Duration::from_millis(10)).await;
//! let published = publisher.published();
//! assert_eq!(published.len(), 2);
//! assert_eq!(published[0].payload, b"created"); // per-key order
//! assert!(published[0].sequence < published[1].sequence);
//! assert!(published[0].headers.iter().any(|(name, _)| name == SEQUENCE_HEADER));
//!
//! token.cancel();
//! let report = relay.await.unwrap();
//! assert_eq!(report.dispatched, 2);
//! # }
//! ```

// docs.rs builds with `--cfg docsrs` on nightly: mark each feature-gated item.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod bucket;
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub mod consume;
mod error;
mod event;
#[cfg(feature = "postgres")]
mod headers;
mod nudge;
mod publish;
mod relay;
mod retention;
mod retry;
mod store;

pub use bucket::bucket_of;
pub use error::{EnqueueError, InvalidEvent, PublishError, PublishErrorKind, StoreError};
pub use event::{EVENT_ID_HEADER, Event, EventId, Limits, OutboxRecord, SEQUENCE_HEADER};
pub use nudge::Nudge;
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub use publish::{KafkaDelivery, KafkaPublisher};
pub use publish::{MemoryPublisher, Published, Publisher};
pub use relay::{
    BatchSummary, Relay, RelayMetrics, RelayMetricsHandle, RelayReport, StopReason, hooks,
};
pub use retention::Retention;
pub use retry::{FailedAttempt, NextAttempt, RetryPolicy};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[doc(hidden)]
pub use store::migrate_up_to;
pub use store::{
    Batch, ClaimLimits, MemoryBatch, MemoryStore, MemoryTransaction, OutboxStats, ParkedEvent,
    Store,
};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use store::{PgBatch, PgStore, Schema, migrate};
