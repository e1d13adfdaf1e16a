//! What a consumer did: `ConsumerReport`, and the messages it gave up on.

use std::fmt;

/// Why a message was given up (its offset was not committed: it is delivered again, to this
/// group's next owner of the partition).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbandonReason {
    /// Its handler was still running when the stop's deadline or the revocation's timeout
    /// passed. The handler runs on to its end; only its result is no longer counted.
    Overran,
    /// Its partition was stopped or revoked after an attempt of it failed (while it backed
    /// off, before it could be dead-lettered, or while its dead-letter send was retried).
    Stopped,
}

/// A message a stop or a revocation gave up on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Abandoned {
    /// Its topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset: the partition's committed offset is at most this.
    pub offset: i64,
    /// Why.
    pub reason: AbandonReason,
    /// The attempts of it that had failed.
    pub failed_attempts: u32,
}

/// The counts of a running consumer, or of one that stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumerMetrics {
    /// Messages handled (the handler returned `Ok`).
    pub handled: u64,
    /// Messages sent to the dead-letter topic.
    pub dead_lettered: u64,
    /// Handler attempts that failed (errors and panics).
    pub failed_attempts: u64,
    /// Handler attempts that panicked.
    pub panics: u64,
    /// Offset commits made: sent (the periodic ones, which do not wait for the
    /// coordinator's answer) or confirmed (at a revocation and at the stop). Each covers
    /// every partition that moved.
    pub commits: u64,
    /// Offset commits that failed when made (the next one covers them). A periodic commit
    /// the coordinator refuses later is logged at warn and sent again by the next periodic
    /// commit; it is not counted here.
    pub commit_failures: u64,
    /// Partitions assigned, summed over rebalances.
    pub assigned: u64,
    /// Partitions revoked, summed over rebalances.
    pub revoked: u64,
    /// Times a partition was paused because its queue was full.
    pub pauses: u64,
    /// Messages given up at a stop or a revocation (not committed; delivered again).
    pub abandoned: u64,
}

/// What a consumer did, returned when it stops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerReport {
    /// The counts.
    pub metrics: ConsumerMetrics,
    /// Messages given up at a stop or a revocation; not committed. The first 1000 are
    /// listed; [`ConsumerMetrics::abandoned`] counts them all.
    pub abandoned: Vec<Abandoned>,
    /// Messages that were fetched and queued but not started when the consumer stopped
    /// (not committed either: delivered again).
    pub unstarted: u64,
    /// Whether the final commit succeeded (or had nothing to commit).
    pub final_commit: Result<(), String>,
    /// A failure that ended the consumer before its token was cancelled, if any.
    pub error: Option<String>,
}

impl ConsumerReport {
    /// The report of a consumer that ended without its books.
    pub(crate) fn failed() -> Self {
        Self {
            metrics: ConsumerMetrics::default(),
            abandoned: Vec::new(),
            unstarted: 0,
            final_commit: Err("not attempted".into()),
            error: None,
        }
    }

    /// Nothing given up, the final commit made, no fatal error.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.abandoned.is_empty() && self.final_commit.is_ok() && self.error.is_none()
    }
}

impl fmt::Display for ConsumerReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.metrics;
        write!(
            f,
            "handled {}, dead-lettered {}, failed attempts {} ({} panics), commits {} ({} failed), partitions assigned {} / revoked {}, pauses {}, unstarted {}",
            m.handled,
            m.dead_lettered,
            m.failed_attempts,
            m.panics,
            m.commits,
            m.commit_failures,
            m.assigned,
            m.revoked,
            m.pauses,
            self.unstarted
        )?;
        for a in &self.abandoned {
            write!(
                f,
                "; abandoned {}/{}/{} ({:?}, {} failed attempts)",
                a.topic, a.partition, a.offset, a.reason, a.failed_attempts
            )?;
        }
        if let Err(error) = &self.final_commit {
            write!(f, "; final commit failed: {error}")?;
        }
        if let Some(error) = &self.error {
            write!(f, "; stopped by: {error}")?;
        }
        Ok(())
    }
}
