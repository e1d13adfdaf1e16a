//! The poll thread: `PollLoop` polls librdkafka, routes each message to its partition's
//! worker, pauses and resumes full partitions, commits periodically, and runs the stop.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use super::commit::commit;
use super::control::{Control, after};
use super::message::Received;
use super::partition::{Counters, Partition, lock};
use super::rebalance::{Books, Context};
use super::report::ConsumerReport;

/// How long the poll thread waits in one `poll`: also how soon it sees a stop.
const POLL_TIMEOUT: Duration = Duration::from_millis(50);

/// The poll thread's state.
pub(super) struct PollLoop {
    pub(super) consumer: BaseConsumer<Context>,
    pub(super) books: Arc<Books>,
    pub(super) token: CancellationToken,
    pub(super) control: Arc<Control>,
    pub(super) commit_interval: Duration,
    pub(super) stop_budget: Duration,
    pub(super) max_queued: usize,
    pub(super) name: String,
    /// The assigned partitions by number, rebuilt when the books' generation moves; only
    /// the poll thread uses it (no lock, no allocation per message).
    pub(super) routes: std::cell::RefCell<(u64, Routes)>,
    /// Messages taken in one burst of polls, per partition, handed over together.
    pub(super) pending: std::cell::RefCell<Vec<(Arc<Partition>, Vec<Received>)>>,
}

/// The assigned partitions by partition number (then topic).
type Routes = HashMap<i32, Vec<Arc<Partition>>>;

/// At most this many messages are taken in one burst before they are handed over.
const BURST: usize = 256;

impl PollLoop {
    pub(super) fn run(self) -> ConsumerReport {
        let mut last_commit = std::time::Instant::now();
        let mut error = None;
        while !self.token.is_cancelled() && !self.control.stop.is_cancelled() {
            if self.books.paused.load(Ordering::Relaxed) > 0 {
                self.resume_drained();
            }
            if last_commit.elapsed() >= self.commit_interval {
                let _ = commit(
                    &self.consumer,
                    &self.assigned(),
                    &self.books.counters,
                    CommitMode::Async,
                );
                last_commit = std::time::Instant::now();
            }
            let failed = match self.consumer.poll(POLL_TIMEOUT) {
                Some(Ok(message)) => {
                    self.route(&message);
                    // What else is ready already, without waiting: handed over together. An
                    // error met here ends the burst and is handled below like one polled
                    // alone (librdkafka raises a fatal error once).
                    let mut failed = None;
                    for _ in 1..BURST {
                        match self.consumer.poll(Duration::ZERO) {
                            Some(Ok(message)) => self.route(&message),
                            Some(Err(e)) => {
                                failed = Some(e);
                                break;
                            }
                            None => break,
                        }
                    }
                    self.flush();
                    failed
                }
                Some(Err(e)) => Some(e),
                None => None,
            };
            if let Some(e) = failed {
                if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
                    tracing::error!(consumer = %self.name, error = %e, "fatal consumer error: stopping");
                    error = Some(e.to_string());
                    break;
                }
                tracing::warn!(consumer = %self.name, error = %e, "consumer error");
            }
        }
        self.finish(error)
    }

    fn assigned(&self) -> Vec<Arc<Partition>> {
        lock(&self.books.partitions).values().cloned().collect()
    }

    /// The partition a message belongs to, if it is assigned to us.
    fn partition_of(&self, topic: &str, number: i32) -> Option<Arc<Partition>> {
        let generation = self.books.generation.load(Ordering::Acquire);
        let mut routes = self.routes.borrow_mut();
        if routes.0 != generation {
            let mut table = Routes::new();
            for partition in lock(&self.books.partitions).values() {
                table
                    .entry(partition.partition)
                    .or_default()
                    .push(Arc::clone(partition));
            }
            *routes = (generation, table);
        }
        routes
            .1
            .get(&number)?
            .iter()
            .find(|p| p.topic == topic)
            .cloned()
    }

    /// Takes a message for its partition's worker, in offset order and once: a message
    /// below the next expected offset was taken already (a resume seeks to the next
    /// expected offset; whatever librdkafka still hands out from before is dropped here).
    fn route(&self, message: &rdkafka::message::BorrowedMessage<'_>) {
        use rdkafka::Message as _;
        let Some(partition) = self.partition_of(message.topic(), message.partition()) else {
            // Not (or no longer) ours: not handled, so not committed by us.
            return;
        };
        let offset = message.offset();
        let next = partition.next.load(Ordering::Relaxed);
        if next >= 0 && offset < next {
            return;
        }
        partition.next.store(offset + 1, Ordering::Relaxed);
        let received = Received::from_kafka(message, Arc::clone(&partition.topic_name));
        let mut pending = self.pending.borrow_mut();
        let at = match pending.iter().position(|(p, _)| Arc::ptr_eq(p, &partition)) {
            Some(at) => at,
            None => {
                pending.push((Arc::clone(&partition), Vec::new()));
                pending.len() - 1
            }
        };
        pending[at].1.push(received);
        // Handed over at once when the queue would reach its limit: the limit holds.
        if partition.queued.load(Ordering::Relaxed) + pending[at].1.len() >= self.max_queued {
            let (partition, messages) = pending.swap_remove(at);
            drop(pending);
            self.hand_over(&partition, messages);
        }
    }

    /// Hands the burst's messages to their workers; pauses a partition whose queue is full.
    fn flush(&self) {
        let pending: Vec<(Arc<Partition>, Vec<Received>)> =
            self.pending.borrow_mut().drain(..).collect();
        for (partition, messages) in pending {
            self.hand_over(&partition, messages);
        }
    }

    fn hand_over(&self, partition: &Arc<Partition>, messages: Vec<Received>) {
        let queued = partition.push(messages);
        // A partition revoked during the burst is not paused: it is not ours any more.
        if queued < self.max_queued
            || partition.stop.is_cancelled()
            || partition.paused.swap(true, Ordering::Relaxed)
        {
            return;
        }
        let mut list = TopicPartitionList::new();
        list.add_partition(&partition.topic, partition.partition);
        match self.consumer.pause(&list) {
            Ok(()) => {
                Counters::add(&self.books.counters.pauses);
                self.books.paused.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                // Not paused: tried again with the next messages.
                partition.paused.store(false, Ordering::Relaxed);
                tracing::warn!(consumer = %self.name, %error, "pausing a full partition failed");
            }
        }
    }

    /// Resumes the paused partitions that drained to half: the resume, then at once (no
    /// poll between them, so no message comes in between) a seek to the next expected
    /// offset, so the fetch restarts exactly after the last message routed, whatever
    /// librdkafka fetched or dropped around the pause (a seek discards what was fetched
    /// before it). A failed seek pauses the partition again, to be retried.
    fn resume_drained(&self) {
        for partition in self.assigned() {
            if !partition.paused.load(Ordering::Relaxed)
                || partition.queued.load(Ordering::Relaxed) > self.max_queued / 2
            {
                continue;
            }
            let mut list = TopicPartitionList::new();
            list.add_partition(&partition.topic, partition.partition);
            if let Err(error) = self.consumer.resume(&list) {
                tracing::warn!(consumer = %self.name, %error, "resume failed; retrying");
                continue;
            }
            let next = partition.next.load(Ordering::Relaxed);
            if next >= 0 {
                let seek = self.consumer.seek(
                    &partition.topic,
                    partition.partition,
                    Offset::Offset(next),
                    Duration::from_secs(5),
                );
                if let Err(error) = seek {
                    tracing::warn!(consumer = %self.name, %error, "seek after a resume failed; pausing again to retry");
                    let _ = self.consumer.pause(&list);
                    continue;
                }
            }
            partition.paused.store(false, Ordering::Relaxed);
            self.books.paused.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The stop: stop fetching, wait for the handlers in flight, commit, leave the group.
    fn finish(self, error: Option<String>) -> ConsumerReport {
        let budget_end = after(self.stop_budget);
        let deadline = || self.control.deadline().unwrap_or(budget_end);
        let partitions: Vec<Arc<Partition>> = lock(&self.books.partitions)
            .drain()
            .map(|(_, p)| p)
            .collect();
        if let Ok(assignment) = self.consumer.assignment() {
            let _ = self.consumer.pause(&assignment);
        }
        for partition in &partitions {
            partition.stop.cancel();
        }
        self.books.wait_for(&partitions, deadline);
        // Handlers of earlier assignments that overran (reported then) get the same time,
        // so that what the caller closes next (a database pool) is not closed under them.
        let earlier: Vec<Arc<Partition>> = lock(&self.books.previous)
            .drain()
            .map(|(_, p)| p)
            .filter(|p| !p.finished.is_set() && !partitions.iter().any(|q| Arc::ptr_eq(p, q)))
            .collect();
        for partition in &earlier {
            partition.finished.wait_until(deadline());
        }
        let unstarted = partitions
            .iter()
            .map(|p| p.queued.load(Ordering::Relaxed) as u64)
            .sum();
        let sync = |partitions: &[Arc<Partition>]| {
            commit(
                &self.consumer,
                partitions,
                &self.books.counters,
                CommitMode::Sync,
            )
        };
        let mut final_commit = sync(&partitions);
        // Retried while the deadline allows (a rebalance in progress fails it for a moment).
        for _ in 0..2 {
            if final_commit.is_ok() || std::time::Instant::now() >= deadline() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
            final_commit = sync(&partitions);
        }
        // Leaving the group: the revocation callback finds no partition left to wait for.
        self.consumer.unsubscribe();
        drop(self.consumer);
        ConsumerReport {
            metrics: self.books.counters.snapshot(),
            abandoned: std::mem::take(&mut *lock(&self.books.counters.abandoned)),
            unstarted,
            final_commit: final_commit.map_err(|e| e.to_string()),
            error,
        }
    }
}
