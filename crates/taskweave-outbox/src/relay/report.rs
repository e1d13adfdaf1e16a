//! What a relay did: one batch's summary and the whole run's report.

use std::fmt;
use std::time::Duration;

use crate::store::OutboxStats;

/// What one batch did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchSummary {
    /// Events claimed.
    pub claimed: usize,
    /// Events published and marked dispatched.
    pub dispatched: usize,
    /// Of `dispatched`: events that had failed before (their key's waiting events can go).
    pub recovered: usize,
    /// Failed attempts (refused, failed acknowledgement, or no acknowledgement within the
    /// budget): one per key, its first failing event; the key's later events wait.
    pub failed: usize,
    /// Of `failed`: events parked (their last attempt, or a permanent error).
    pub parked: usize,
    /// Of `failed`: events that back off and are tried again later.
    pub backing_off: usize,
    /// Of `failed`: events whose acknowledgement was still missing when the publish time
    /// ran out (one per key, as `failed`: a key's later unacknowledged events wait).
    pub timed_out: usize,
    /// Events not sent because an earlier event of their key had failed, or the time ran out.
    pub held_back: usize,
    /// Events acknowledged after an earlier event of their key failed (left pending).
    pub sent_after_failure: usize,
    /// Whether the commit failed after publishing (the batch will be published again).
    pub commit_failed: bool,
    /// Whether nothing was delivered and every failure was retriable (a broker down, or a
    /// producer gone silent): after a few such batches in a row the relay asks the
    /// publisher to [recover](crate::Publisher::recover).
    pub stalled: bool,
    /// The publisher's fatal error, if it failed for good during the batch.
    pub fatal: Option<String>,
    /// Claim to commit.
    pub took: Duration,
}

/// Why a relay stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// Its token was cancelled.
    Cancelled,
    /// [`drain`](crate::Relay::drain): nothing was left to claim.
    Drained,
    /// [`drain`](crate::Relay::drain): the deadline left less than one batch budget, so the
    /// next batch was not started.
    DeadlineTooClose {
        /// The time that was left.
        remaining: Duration,
    },
    /// The [`Shutdown`](taskweave_shutdown::Shutdown) it was tied to was closing its
    /// resources: no batch may start then.
    ShutdownClosing,
    /// The publisher failed for good (a fatal error of the Kafka producer): the batch in
    /// flight committed what was delivered, and the relay stopped so that whoever runs it
    /// (a `Supervisor` with a restart policy) can start a new one with a new publisher.
    PublisherFailed(String),
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cancelled => f.write_str("cancelled"),
            Self::Drained => f.write_str("drained"),
            Self::DeadlineTooClose { remaining } => {
                write!(
                    f,
                    "deadline too close for another batch ({remaining:?} left)"
                )
            }
            Self::ShutdownClosing => f.write_str("shutdown closing its resources"),
            Self::PublisherFailed(error) => write!(f, "publisher failed: {error}"),
        }
    }
}

/// What a relay did from start to stop.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayReport {
    /// The relay's name.
    pub name: String,
    /// Batches that claimed events.
    pub batches: u64,
    /// Events published and marked dispatched.
    pub dispatched: u64,
    /// Publishes that failed.
    pub failed: u64,
    /// Claims or commits the store refused.
    pub store_errors: u64,
    /// Whether a batch was in flight when the token was cancelled, and finished.
    pub finished_batch_after_cancel: bool,
    /// The last batch.
    pub last_batch: Option<BatchSummary>,
    /// What was left in the store when it stopped (`None` if the store did not answer
    /// within 2 s or, for a drain, before its deadline).
    pub left: Option<OutboxStats>,
    /// Why it stopped.
    pub stopped: StopReason,
}

impl RelayReport {
    pub(crate) fn new(name: String) -> Self {
        Self {
            name,
            batches: 0,
            dispatched: 0,
            failed: 0,
            store_errors: 0,
            finished_batch_after_cancel: false,
            last_batch: None,
            left: None,
            stopped: StopReason::Cancelled,
        }
    }

    pub(crate) fn add(&mut self, batch: &BatchSummary) {
        if batch.claimed > 0 {
            self.batches += 1;
        }
        self.dispatched += batch.dispatched as u64;
        self.failed += batch.failed as u64;
        if batch.commit_failed {
            self.store_errors += 1;
        }
    }
}

impl fmt::Display for RelayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} batches, {} dispatched, {} failed, {} store errors; stopped: {}",
            self.name, self.batches, self.dispatched, self.failed, self.store_errors, self.stopped
        )?;
        if self.finished_batch_after_cancel {
            f.write_str(" (finished the batch in flight)")?;
        }
        if let Some(last) = &self.last_batch {
            write!(
                f,
                "; last batch: {} claimed, {} dispatched, {} failed in {:?}",
                last.claimed, last.dispatched, last.failed, last.took
            )?;
        }
        if let Some(left) = &self.left {
            write!(
                f,
                "; left: {} pending ({} backing off), {} parked, {} behind parked",
                left.pending, left.backing_off, left.parked, left.behind_parked
            )?;
            if let Some(lag) = left.oldest_pending_age {
                write!(f, ", oldest {lag:?}")?;
            }
        }
        Ok(())
    }
}
