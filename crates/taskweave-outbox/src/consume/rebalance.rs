//! The assigned partitions (`Books`), kept by the librdkafka context's rebalance callbacks
//! (`Context`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::commit::commit;
use super::control::{Control, after};
use super::message::Received;
use super::partition::{Counters, Partition, lock};
use super::report::{AbandonReason, Abandoned};

type StartWorker = Box<
    dyn Fn(
            Arc<Partition>,
            tokio::sync::mpsc::UnboundedReceiver<Vec<Received>>,
            Option<Arc<Partition>>,
        ) + Send
        + Sync,
>;

/// The assigned partitions, shared by the poll loop and the rebalance callbacks (which run
/// on the poll thread, inside `poll`).
pub(super) struct Books {
    pub(super) partitions: Mutex<HashMap<(String, i32), Arc<Partition>>>,
    /// Partitions revoked (or stopped) while their worker still ran (a handler that overran):
    /// the next assignment's worker waits for theirs to finish.
    pub(super) previous: Mutex<HashMap<(String, i32), Arc<Partition>>>,
    /// Partitions paused now, so the poll loop looks for drained ones only when there are.
    pub(super) paused: std::sync::atomic::AtomicUsize,
    /// Bumped at every assignment and revocation: the poll loop's routing table is stale.
    pub(super) generation: std::sync::atomic::AtomicU64,
    pub(super) counters: Arc<Counters>,
    pub(super) control: Arc<Control>,
    pub(super) revoke_timeout: Duration,
    pub(super) start_worker: StartWorker,
}

impl Books {
    fn assign<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>, list: &TopicPartitionList) {
        let mut fresh = TopicPartitionList::new();
        let mut partitions = lock(&self.partitions);
        lock(&self.previous).retain(|_, p| !p.finished.is_set());
        for element in list.elements() {
            let key = (element.topic().to_owned(), element.partition());
            if partitions.contains_key(&key) {
                continue;
            }
            let previous = lock(&self.previous).remove(&key);
            let (partition, queue) = Partition::new(element.topic(), element.partition());
            partitions.insert(key, Arc::clone(&partition));
            fresh.add_partition(element.topic(), element.partition());
            Counters::add(&self.counters.assigned);
            (self.start_worker)(partition, queue, previous);
        }
        drop(partitions);
        self.generation.fetch_add(1, Ordering::Release);
        // librdkafka keeps an application pause across a revocation: a partition paused
        // for back-pressure before it was revoked would come back paused for good.
        if fresh.count() > 0
            && let Err(error) = consumer.resume(&fresh)
        {
            tracing::warn!(%error, "resuming newly assigned partitions failed");
        }
    }

    /// Stops the partitions in `list`, waits for their handlers in flight until the revoke
    /// timeout (or the stop's deadline, if sooner), and commits what finished (unless the
    /// assignment was lost).
    fn revoke<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>, list: &TopicPartitionList) {
        let revoked: Vec<Arc<Partition>> = {
            let mut partitions = lock(&self.partitions);
            list.elements()
                .iter()
                .filter_map(|e| partitions.remove(&(e.topic().to_owned(), e.partition())))
                .collect()
        };
        self.generation.fetch_add(1, Ordering::Release);
        for partition in &revoked {
            partition.stop.cancel();
            if partition.paused.swap(false, Ordering::Relaxed) {
                self.paused.fetch_sub(1, Ordering::Relaxed);
            }
            Counters::add(&self.counters.revoked);
        }
        let until = after(self.revoke_timeout);
        self.wait_for(&revoked, || {
            self.control
                .deadline()
                .map_or(until, |stop| stop.min(until))
        });
        if !consumer.assignment_lost() {
            let _ = commit(consumer, &revoked, &self.counters, CommitMode::Sync);
        }
    }

    /// Waits for `partitions`' workers until `deadline()` (read again as it waits, so a stop
    /// can shorten or lengthen it); reports the handlers that overran, caps their commits
    /// below the message they were on, and keeps their partitions for the next assignment's
    /// worker to wait on.
    pub(super) fn wait_for(
        &self,
        partitions: &[Arc<Partition>],
        deadline: impl Fn() -> std::time::Instant,
    ) {
        for partition in partitions {
            loop {
                let until = deadline();
                let slice = until.min(after(Duration::from_millis(50)));
                if partition.finished.wait_until(slice) || std::time::Instant::now() >= until {
                    break;
                }
            }
            if partition.finished.is_set() {
                continue;
            }
            if let Some(offset) = partition.give_up() {
                self.abandon(Abandoned {
                    topic: partition.topic.clone(),
                    partition: partition.partition,
                    offset,
                    reason: AbandonReason::Overran,
                    failed_attempts: 0,
                });
            }
            lock(&self.previous).insert(
                (partition.topic.clone(), partition.partition),
                Arc::clone(partition),
            );
        }
    }

    fn abandon(&self, abandoned: Abandoned) {
        self.counters.abandon(abandoned);
    }
}

/// The librdkafka context: rebalance callbacks into the books.
pub(super) struct Context {
    pub(super) books: Arc<Books>,
}

impl ClientContext for Context {}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(list) => self.books.revoke(consumer, list),
            Rebalance::Assign(_) => {}
            Rebalance::Error(error) => tracing::warn!(%error, "rebalance error"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance {
            self.books.assign(consumer, list);
        }
    }

    /// The coordinator's answer to a commit (an asynchronous one returns before it): a
    /// refusal is logged and its partitions' offsets are sent again by the next periodic
    /// commit, also on a partition that handles nothing more meanwhile.
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(error) = &result {
            tracing::warn!(%error, "offset commit refused by the coordinator; the next commit sends it again");
        }
        // Served inside `poll`, which is never called with this lock held (`assign` and
        // `revoke` release it before they call into librdkafka).
        let partitions = lock(&self.books.partitions);
        for element in offsets.elements() {
            let Offset::Offset(offset) = element.offset() else {
                continue;
            };
            let key = (element.topic().to_owned(), element.partition());
            if let Some(partition) = partitions.get(&key) {
                partition.commit_answered(offset, result.is_ok() && element.error().is_ok());
            }
        }
    }
}
