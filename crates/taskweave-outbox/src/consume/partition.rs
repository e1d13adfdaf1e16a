//! One assigned partition: its queue, its worker task, and its books (what was handled,
//! what was committed, what is in flight).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::dead_letter::DeadLetter;
use super::message::{HandleError, Handler, Received};
use super::report::{AbandonReason, Abandoned};
use crate::retry::RetryPolicy;

pub(crate) use taskweave_supervise::internal::lock;

/// The consumer's counters, shared by the poll thread and the workers.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) handled: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) failed_attempts: AtomicU64,
    pub(crate) panics: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) commit_failures: AtomicU64,
    pub(crate) assigned: AtomicU64,
    pub(crate) revoked: AtomicU64,
    pub(crate) pauses: AtomicU64,
    pub(crate) abandoned_total: AtomicU64,
    pub(crate) abandoned: Mutex<Vec<Abandoned>>,
}

/// How many abandoned messages a report lists (the rest are counted).
const MAX_LISTED: usize = 1000;

impl Counters {
    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a message given up, and lists it while the list is short.
    pub(crate) fn abandon(&self, abandoned: Abandoned) {
        Self::add(&self.abandoned_total);
        let mut list = lock(&self.abandoned);
        if list.len() < MAX_LISTED {
            list.push(abandoned);
        }
    }
}

/// Set once, when a worker has returned; waited on by the poll thread (blocking) and by the
/// worker of the same partition's next assignment (async).
#[derive(Default)]
pub(crate) struct Finished {
    done: Mutex<bool>,
    changed: Condvar,
    notify: Notify,
}

impl Finished {
    fn set(&self) {
        *lock(&self.done) = true;
        self.changed.notify_all();
        self.notify.notify_waiters();
    }

    pub(crate) fn is_set(&self) -> bool {
        *lock(&self.done)
    }

    /// Blocks the calling (non-runtime) thread until set or `until`.
    pub(crate) fn wait_until(&self, until: std::time::Instant) -> bool {
        let mut done = lock(&self.done);
        while !*done {
            let Some(left) = until.checked_duration_since(std::time::Instant::now()) else {
                return false;
            };
            done = self
                .changed
                .wait_timeout(done, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

/// An assigned partition.
pub(crate) struct Partition {
    pub(crate) topic: String,
    /// The topic again, shared by every message routed here (no allocation per message).
    pub(crate) topic_name: Arc<str>,
    pub(crate) partition: i32,
    sender: mpsc::UnboundedSender<Vec<Received>>,
    /// Messages routed to the worker and not yet taken.
    pub(crate) queued: AtomicUsize,
    /// Paused by the poll thread because its queue is full.
    pub(crate) paused: AtomicBool,
    /// Cancelled at a revocation or a stop: the worker takes no further message and gives up
    /// a backoff; the attempt in flight runs to its end.
    pub(crate) stop: CancellationToken,
    /// The next offset to commit (the last handled one + 1), or -1.
    pub(crate) handled: AtomicI64,
    /// The offset last committed and confirmed, or -1.
    pub(crate) committed: AtomicI64,
    /// The offset last sent in a commit (confirmed or not), or -1.
    pub(crate) sent: AtomicI64,
    /// The offset of the message being handled.
    pub(crate) in_flight: Mutex<Option<i64>>,
    /// No commit goes past this: the offset of a message given up while its handler ran.
    commit_cap: AtomicI64,
    /// The next offset the poll thread expects (-1 before the first message); only the
    /// poll thread touches it.
    pub(crate) next: AtomicI64,
    pub(crate) finished: Finished,
}

impl Partition {
    /// A partition's books and the receiving end of its queue.
    pub(crate) fn new(
        topic: &str,
        partition: i32,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<Vec<Received>>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let partition = Arc::new(Self {
            topic: topic.to_owned(),
            topic_name: topic.into(),
            partition,
            sender,
            queued: AtomicUsize::new(0),
            paused: AtomicBool::new(false),
            stop: CancellationToken::new(),
            handled: AtomicI64::new(-1),
            committed: AtomicI64::new(-1),
            sent: AtomicI64::new(-1),
            in_flight: Mutex::new(None),
            commit_cap: AtomicI64::new(i64::MAX),
            next: AtomicI64::new(-1),
            finished: Finished::default(),
        });
        (partition, receiver)
    }

    /// Hands messages (in offset order) to the worker; returns the queue's length.
    pub(crate) fn push(&self, messages: Vec<Received>) -> usize {
        let n = messages.len();
        let queued = self.queued.fetch_add(n, Ordering::Relaxed) + n;
        if self.sender.send(messages).is_err() {
            // The worker has returned (stopped): the messages are not handled, so their
            // offsets are never committed and they are delivered again.
            return self.queued.fetch_sub(n, Ordering::Relaxed) - n;
        }
        queued
    }

    /// The offset it is safe to commit: past every handled message, never past one given up.
    fn committable(&self) -> i64 {
        self.handled
            .load(Ordering::Acquire)
            .min(self.commit_cap.load(Ordering::Acquire))
    }

    /// The offset to commit and wait for, when it moved past the last confirmed commit.
    pub(crate) fn to_commit(&self) -> Option<i64> {
        let offset = self.committable();
        (offset > self.committed.load(Ordering::Relaxed)).then_some(offset)
    }

    /// The offset to send without waiting, when it moved past the last one sent.
    pub(crate) fn to_send(&self) -> Option<i64> {
        let offset = self.committable();
        (offset > self.sent.load(Ordering::Relaxed)).then_some(offset)
    }

    /// The coordinator's answer to a commit of `offset`: confirmed, or refused, in which case
    /// the next periodic commit sends the partition's offset again (one sent later and
    /// still unanswered is sent again too: a duplicate commit, harmless).
    pub(crate) fn commit_answered(&self, offset: i64, confirmed: bool) {
        if confirmed {
            self.committed.fetch_max(offset, Ordering::Relaxed);
        } else {
            self.sent
                .fetch_min(self.committed.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Gives up on the message in flight, if any: returns its offset, and no commit of this
    /// partition passes it from now on (even if its handler finishes after all).
    pub(crate) fn give_up(&self) -> Option<i64> {
        let in_flight = lock(&self.in_flight);
        let offset = (*in_flight)?;
        self.commit_cap.store(offset, Ordering::Release);
        Some(offset)
    }
}

/// What every worker shares.
pub(crate) struct Workers<H> {
    pub(crate) name: String,
    /// The name a handler's panic is reported under.
    pub(crate) handler_name: taskweave_supervise::TaskName,
    pub(crate) handler: H,
    pub(crate) permits: Semaphore,
    pub(crate) retry: RetryPolicy,
    pub(crate) dead_letter: Option<DeadLetter>,
    pub(crate) counters: Arc<Counters>,
}

/// The worker of one partition: its messages one at a time, in order.
pub(crate) async fn work<H: Handler>(
    workers: Arc<Workers<H>>,
    partition: Arc<Partition>,
    mut queue: mpsc::UnboundedReceiver<Vec<Received>>,
    previous: Option<Arc<Partition>>,
) {
    // Finished however this ends (a panic of ours, the runtime shutting down).
    let _finished = FinishOnDrop(Arc::clone(&partition));
    // The same partition's worker from an earlier assignment may still be running a handler
    // that overran its revocation: its message comes again here, and must not be handled by
    // two workers at once.
    if let Some(previous) = &previous {
        tokio::select! {
            biased;
            () = partition.stop.cancelled() => {}
            () = previous.finished.wait() => {}
        }
    }
    'work: while !partition.stop.is_cancelled() {
        let batch = tokio::select! {
            biased;
            () = partition.stop.cancelled() => break,
            batch = queue.recv() => match batch {
                Some(batch) => batch,
                None => break,
            },
        };
        for message in batch {
            if partition.stop.is_cancelled() {
                break 'work;
            }
            partition.queued.fetch_sub(1, Ordering::Relaxed);
            let offset = message.offset();
            if handle(&workers, &partition, message).await {
                partition.handled.store(offset + 1, Ordering::Release);
            } else {
                break 'work;
            }
        }
    }
    queue.close();
    // Finished only once the predecessor is: whoever waits on this worker (the next
    // assignment's) then also waits on the handler that overran before it.
    if let Some(previous) = previous {
        previous.finished.wait().await;
    }
}

struct FinishOnDrop(Arc<Partition>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        self.0.finished.set();
    }
}

/// Handles one message: the handler, its retries, then the dead-letter topic. `false` when
/// it was given up at a stop (not handled: it is delivered again).
async fn handle<H: Handler>(
    workers: &Workers<H>,
    partition: &Partition,
    message: Received,
) -> bool {
    let offset = message.offset();
    let mut failed: u32 = 0;
    loop {
        let permit = tokio::select! {
            biased;
            () = partition.stop.cancelled() => {
                // Not started yet (or between retries): delivered again, like a queued one.
                if failed > 0 {
                    abandon(workers, partition, offset, AbandonReason::Stopped, failed);
                } else {
                    // Never started: counted with the queued ones it was taken from
                    // (`ConsumerReport::unstarted`).
                    partition.queued.fetch_add(1, Ordering::Relaxed);
                }
                return false;
            }
            permit = workers.permits.acquire() => permit.expect("the semaphore is never closed"),
        };
        *lock(&partition.in_flight) = Some(offset);
        // The call itself inside the catch: a handler may panic before its first await.
        let result = taskweave_supervise::catch_panic(workers.handler_name.clone(), async {
            workers.handler.handle(message.clone()).await
        })
        .await;
        *lock(&partition.in_flight) = None;
        drop(permit);
        let error = match result {
            Ok(Ok(())) => {
                Counters::add(&workers.counters.handled);
                return true;
            }
            Ok(Err(error)) => error,
            Err(panic) => {
                Counters::add(&workers.counters.panics);
                HandleError::retriable(format!("the handler panicked: {}", panic.message()))
            }
        };
        Counters::add(&workers.counters.failed_attempts);
        failed = failed.saturating_add(1);
        let exhausted = error.is_permanent() || failed >= workers.retry.max_attempts();
        if exhausted {
            if partition.stop.is_cancelled() {
                // Revoked or stopping: the next owner gets it again; dead-lettering it now
                // would also send it to the dead-letter topic.
                abandon(workers, partition, offset, AbandonReason::Stopped, failed);
                return false;
            }
            if let Some(dead_letter) = &workers.dead_letter {
                return dead_letter_it(workers, dead_letter, partition, &message, &error, failed)
                    .await;
            }
            tracing::error!(
                consumer = %workers.name, topic = %message.topic(), partition = message.partition(),
                offset, attempts = failed, %error,
                "a message failed for good and no dead-letter topic is set: its partition retries it at the policy's cap"
            );
        } else {
            tracing::warn!(
                consumer = %workers.name, topic = %message.topic(), partition = message.partition(),
                offset, attempt = failed, %error, "handler failed; retrying"
            );
        }
        if !pause(
            partition,
            retry_delay(&workers.retry, offset, failed, exhausted),
        )
        .await
        {
            abandon(workers, partition, offset, AbandonReason::Stopped, failed);
            return false;
        }
    }
}

async fn dead_letter_it<H: Handler>(
    workers: &Workers<H>,
    dead_letter: &DeadLetter,
    partition: &Partition,
    message: &Received,
    error: &HandleError,
    attempts: u32,
) -> bool {
    let offset = message.offset();
    let mut tries: u32 = 0;
    loop {
        // In flight while it is sent: a stop that gives up on it reports it.
        *lock(&partition.in_flight) = Some(offset);
        let sent = dead_letter.send(message, error, attempts).await;
        *lock(&partition.in_flight) = None;
        match sent {
            Ok(()) => {
                Counters::add(&workers.counters.dead_lettered);
                tracing::warn!(
                    consumer = %workers.name, topic = %message.topic(), partition = message.partition(),
                    offset, attempts, %error, dead_letter_topic = %dead_letter.topic,
                    "message dead-lettered"
                );
                return true;
            }
            Err(send_error) => {
                tries = tries.saturating_add(1);
                tracing::error!(
                    consumer = %workers.name, topic = %message.topic(), offset, %send_error,
                    "dead-lettering failed; retrying (the partition waits)"
                );
                if !pause(partition, workers.retry.delay(offset, tries)).await {
                    abandon(workers, partition, offset, AbandonReason::Stopped, attempts);
                    return false;
                }
            }
        }
    }
}

/// The wait before the next attempt of the message at `offset` after `failed` failed
/// attempts: the policy's backoff, or its cap (with its jitter) once the message has failed
/// for good and stays because no dead-letter topic is set.
fn retry_delay(policy: &RetryPolicy, offset: i64, failed: u32, for_good: bool) -> Duration {
    policy.delay(offset, if for_good { u32::MAX } else { failed })
}

/// Sleeps `delay` unless the partition stops first (`false`).
async fn pause(partition: &Partition, delay: Duration) -> bool {
    tokio::select! {
        biased;
        () = partition.stop.cancelled() => false,
        () = tokio::time::sleep(delay) => true,
    }
}

fn abandon<H>(
    workers: &Workers<H>,
    partition: &Partition,
    offset: i64,
    reason: AbandonReason,
    failed: u32,
) {
    // Given up already (a stop or revocation stopped waiting while this attempt ran).
    if partition.commit_cap.load(Ordering::Acquire) == offset {
        return;
    }
    workers.counters.abandon(Abandoned {
        topic: partition.topic.clone(),
        partition: partition.partition,
        offset,
        reason,
        failed_attempts: failed,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_failed_for_good_without_a_dead_letter_topic_waits_at_the_cap() {
        let policy = RetryPolicy::new()
            .with_initial_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(10));
        for offset in 0..50 {
            // A permanent error at the first attempt: the cap, not the first backoff.
            let delay = retry_delay(&policy, offset, 1, true);
            assert!(
                delay >= Duration::from_secs(5) && delay <= Duration::from_secs(10),
                "{delay:?}"
            );
            // Still retrying: the backoff after one failure.
            assert!(retry_delay(&policy, offset, 1, false) <= Duration::from_millis(200));
        }
    }

    #[test]
    fn a_refused_commit_is_sent_again_and_a_confirmed_one_counts_as_committed() {
        let (partition, _queue) = Partition::new("t", 0);
        partition.handled.store(5, Ordering::Relaxed);
        assert_eq!(partition.to_send(), Some(5));
        partition.sent.store(5, Ordering::Relaxed);
        assert_eq!(partition.to_send(), None, "sent, nothing new");
        // Refused later by the coordinator: the idle partition sends it again.
        partition.commit_answered(5, false);
        assert_eq!(partition.to_send(), Some(5));
        partition.sent.store(5, Ordering::Relaxed);
        partition.commit_answered(5, true);
        assert_eq!(partition.committed.load(Ordering::Relaxed), 5);
        assert_eq!(
            partition.to_commit(),
            None,
            "confirmed: a revocation has nothing to send"
        );
        // A late refusal of an older commit does not undo a newer confirmation.
        partition.commit_answered(3, false);
        assert_eq!(partition.to_send(), None);
    }
}
