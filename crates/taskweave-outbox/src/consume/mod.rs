//! The consuming end: a Kafka consumer runner that hands each message to a handler, in
//! order per partition and in parallel across partitions, and commits an offset only after
//! its message was handled (at least once); and, with the `postgres` feature, a
//! transactional [`Inbox`] that makes a handler's effects in the database happen once.

mod commit;
mod consumer;
mod control;
mod dead_letter;
mod error;
#[cfg(feature = "postgres")]
mod inbox;
mod message;
mod metrics;
mod partition;
mod poll;
mod rebalance;
mod report;
mod running;

pub use consumer::Consumer;
pub use dead_letter::{
    DEAD_LETTER_ATTEMPTS_HEADER, DEAD_LETTER_ERROR_HEADER, DEAD_LETTER_ORIGIN_HEADER, DeadLetter,
};
pub use error::ConsumeError;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use inbox::{Inbox, InboxHandler, InboxStats, StalePolicy};
pub use message::{HandleError, Handler, Received};
pub use metrics::ConsumerMetricsHandle;
pub use report::{AbandonReason, Abandoned, ConsumerMetrics, ConsumerReport};
pub use running::RunningConsumer;
