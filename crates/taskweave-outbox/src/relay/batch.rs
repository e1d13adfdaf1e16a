//! One batch of the relay: claim, send in id order, await the acknowledgements, mark
//! what was delivered, record what failed, commit.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;

use super::{BatchSummary, CLAIM_SHARE, PUBLISH_SHARE, Relay, hooks};
use crate::error::{PublishError, PublishErrorKind, StoreError};
use crate::publish::Publisher;
use crate::retry::{FailedAttempt, NextAttempt};
use crate::store::{Batch, ClaimLimits, Store};

impl<S: Store, P: Publisher> Relay<S, P> {
    /// One batch: claim, send in id order, await acknowledgements, mark, commit. Never
    /// raced against the token.
    pub(super) async fn batch(&self) -> Result<BatchSummary, StoreError> {
        let started = Instant::now();
        let publish_deadline = started
            .checked_add(self.batch_budget.mul_f64(PUBLISH_SHARE))
            .unwrap_or_else(|| started + Duration::from_secs(100 * 365 * 86_400));
        // The claim gets a tenth of the budget (a pool that has no connection to give, a
        // server that does not answer); dropping a claim halfway is safe (see `Store`).
        let claim = self.store.claim(ClaimLimits {
            buckets: self.buckets_per_batch,
            events: self.batch_size,
            hold_at_most: self.batch_budget,
        });
        let batch = tokio::time::timeout(self.batch_budget.mul_f64(CLAIM_SHARE), claim)
            .await
            .map_err(|_| StoreError::TimedOut("claiming a batch".to_owned()))??;
        let records = batch.records();
        let mut summary = BatchSummary {
            claimed: records.len(),
            ..BatchSummary::default()
        };
        if records.is_empty() {
            self.counters.empty_poll();
            batch.commit(Vec::new()).await?;
            summary.took = started.elapsed();
            return Ok(summary);
        }
        self.hook(hooks::Point::BeforePublish).await;

        // Send in id order. A key whose record failed to send is blocked for the rest of
        // the batch; so is everything after a send that ran out of time.
        let mut blocked: HashSet<&[u8]> = HashSet::new();
        let mut outcomes: Vec<Outcome> = vec![Outcome::HeldBack; records.len()];
        let mut deliveries = FuturesUnordered::new();
        let mut out_of_time = false;
        for (index, record) in records.iter().enumerate() {
            if out_of_time || blocked.contains(record.key.as_slice()) {
                summary.held_back += 1;
                continue;
            }
            match tokio::time::timeout_at(publish_deadline, self.publisher.send(record)).await {
                Ok(Ok(delivery)) => {
                    outcomes[index] = Outcome::Sent;
                    deliveries.push(async move { (index, delivery.await) });
                }
                Ok(Err(error)) => {
                    tracing::warn!(relay = %self.name, id = record.id, topic = %record.topic, %error, "outbox publish failed");
                    blocked.insert(record.key.as_slice());
                    if error.kind() == PublishErrorKind::Fatal {
                        summary
                            .fatal
                            .get_or_insert_with(|| error.message().to_owned());
                        // Nothing more can go through this publisher.
                        out_of_time = true;
                    }
                    outcomes[index] = Outcome::Failed(error);
                }
                Err(_) => {
                    tracing::warn!(relay = %self.name, id = record.id, "outbox batch ran out of publish time while sending");
                    out_of_time = true;
                    summary.held_back += 1;
                }
            }
        }
        loop {
            match tokio::time::timeout_at(publish_deadline, deliveries.next()).await {
                Ok(Some((index, Ok(())))) => outcomes[index] = Outcome::Delivered,
                Ok(Some((index, Err(error)))) => {
                    let record = &records[index];
                    tracing::warn!(relay = %self.name, id = record.id, topic = %record.topic, %error, "outbox publish failed");
                    if error.kind() == PublishErrorKind::Fatal {
                        summary
                            .fatal
                            .get_or_insert_with(|| error.message().to_owned());
                    }
                    outcomes[index] = Outcome::Failed(error);
                }
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(relay = %self.name, unacknowledged = deliveries.len(), "outbox batch ran out of publish time awaiting acknowledgements");
                    break;
                }
            }
        }
        drop(deliveries);
        self.hook(hooks::Point::AfterAcks).await;

        // Mark a key's records while they succeed; at its first failure record the failed
        // attempt (back off or park) and mark nothing more of it.
        let mut failed_keys: HashSet<&[u8]> = HashSet::new();
        let mut dispatched = Vec::with_capacity(records.len());
        let mut failed = Vec::new();
        for (record, outcome) in records.iter().zip(outcomes) {
            let key = record.key.as_slice();
            if failed_keys.contains(key) {
                if matches!(outcome, Outcome::Delivered) {
                    summary.sent_after_failure += 1;
                }
                continue;
            }
            let error = match outcome {
                Outcome::Delivered => {
                    dispatched.push(record.id);
                    summary.recovered += usize::from(record.attempts > 0);
                    continue;
                }
                Outcome::HeldBack => {
                    // Never sent (time ran out, or the publisher failed for good): not the
                    // event's fault, so no attempt is counted.
                    failed_keys.insert(key);
                    continue;
                }
                Outcome::Sent => {
                    // Still unacknowledged: counted only as its key's first failure.
                    summary.timed_out += 1;
                    PublishError::retriable("no acknowledgement within the batch's publish time")
                }
                Outcome::Failed(error) => error,
            };
            failed_keys.insert(key);
            summary.failed += 1;
            self.counters.publish_failed(error.kind(), 1);
            if error.kind() == PublishErrorKind::Fatal {
                // The publisher broke, not the event: it is retried by the next relay.
                continue;
            }
            let attempts = record.attempts.saturating_add(1);
            let next = self.retry.next(record.id, attempts, error.kind());
            match next {
                NextAttempt::Park => {
                    summary.parked += 1;
                    tracing::error!(relay = %self.name, id = record.id, event_id = %record.event_id, topic = %record.topic, attempts, %error, "outbox event parked: it and the later events of its key wait for an operator (Store::parked)");
                }
                NextAttempt::After(delay) => {
                    summary.backing_off += 1;
                    tracing::debug!(relay = %self.name, id = record.id, attempts, ?delay, "outbox event backs off");
                }
            }
            failed.push(FailedAttempt {
                id: record.id,
                error: error.to_string(),
                next,
            });
        }
        let delivered = dispatched.len();
        summary.stalled =
            delivered == 0 && summary.failed > 0 && summary.fatal.is_none() && summary.parked == 0;
        let (parked, backing_off) = (summary.parked, summary.backing_off);
        match batch.complete(dispatched, failed).await {
            Ok(()) => {
                summary.dispatched = delivered;
                self.counters.batch_committed(&summary, parked, backing_off);
            }
            Err(error) => {
                // Published but not marked: these will be published again.
                summary.commit_failed = true;
                summary.recovered = 0;
                summary.parked = 0;
                summary.backing_off = 0;
                self.counters.commit_failed(delivered);
                tracing::warn!(relay = %self.name, error = %error, published = delivered, "outbox commit failed after publishing: these events will be published again");
            }
        }
        self.hook(hooks::Point::AfterCommit).await;
        summary.took = started.elapsed();
        self.counters.batch_took(summary.claimed, summary.took);
        tracing::debug!(relay = %self.name, claimed = summary.claimed, dispatched = summary.dispatched, failed = summary.failed, took = ?summary.took, "outbox batch");
        Ok(summary)
    }

    #[cfg(feature = "test-hooks")]
    async fn hook(&self, point: hooks::Point) {
        if let Some(hook) = &self.hook {
            hook(point).await;
        }
    }

    #[cfg(not(feature = "test-hooks"))]
    #[allow(
        clippy::unused_async,
        reason = "the same call with and without test hooks"
    )]
    async fn hook(&self, _point: hooks::Point) {}
}

/// Where one record of a batch stands.
#[derive(Clone, Debug)]
enum Outcome {
    /// Not sent.
    HeldBack,
    /// Sent; no acknowledgement yet (or none within the publish time).
    Sent,
    /// Acknowledged.
    Delivered,
    /// Refused at send, or its acknowledgement failed.
    Failed(PublishError),
}
