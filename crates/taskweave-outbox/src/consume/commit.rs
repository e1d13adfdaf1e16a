//! Committing the handled offsets of the assigned partitions: `commit`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use super::partition::{Counters, Partition};

/// Commits the handled offsets of `partitions` that moved. `CommitMode::Async` (the
/// periodic commits) sends what moved since the last send and does not wait, so the poll
/// thread never waits on the coordinator; `CommitMode::Sync` (a revocation, the stop)
/// commits what moved since the last confirmed commit and waits for the answer.
pub(super) fn commit<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &[Arc<Partition>],
    counters: &Counters,
    mode: CommitMode,
) -> Result<(), KafkaError> {
    let mut list = TopicPartitionList::new();
    let mut moved = Vec::new();
    for partition in partitions {
        let offset = match mode {
            CommitMode::Async => partition.to_send(),
            CommitMode::Sync => partition.to_commit(),
        };
        if let Some(offset) = offset {
            list.add_partition_offset(
                &partition.topic,
                partition.partition,
                Offset::Offset(offset),
            )?;
            moved.push((partition, offset));
        }
    }
    if moved.is_empty() {
        return Ok(());
    }
    match consumer.commit(&list, mode) {
        Ok(()) => {
            for (partition, offset) in moved {
                partition.sent.fetch_max(offset, Ordering::Relaxed);
                if matches!(mode, CommitMode::Sync) {
                    partition.committed.store(offset, Ordering::Relaxed);
                }
            }
            Counters::add(&counters.commits);
            Ok(())
        }
        Err(error) => {
            Counters::add(&counters.commit_failures);
            tracing::warn!(%error, "offset commit failed; the next one covers it");
            Err(error)
        }
    }
}
