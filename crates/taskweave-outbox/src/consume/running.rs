//! A started consumer: [`RunningConsumer`], to read its counts, stop it, wait for it, or
//! hand it to a shutdown phase.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::control::Control;
use super::metrics::ConsumerMetricsHandle;
use super::partition::{Counters, lock};
use super::rebalance::Books;
use super::report::{ConsumerMetrics, ConsumerReport};

/// A started consumer.
///
/// Dropping it does not stop the consumer: cancel its token, or call
/// [`stop`](Self::stop).
pub struct RunningConsumer {
    pub(super) control: Arc<Control>,
    pub(super) counters: Arc<Counters>,
    pub(super) books: Arc<Books>,
    pub(super) report: oneshot::Receiver<ConsumerReport>,
}

impl fmt::Debug for RunningConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunningConsumer")
            .field("metrics", &self.metrics())
            .finish_non_exhaustive()
    }
}

impl RunningConsumer {
    /// The counts so far.
    #[must_use]
    pub fn metrics(&self) -> ConsumerMetrics {
        self.counters.snapshot()
    }

    /// A handle to the counts, readable after the consumer was moved away (into a shutdown
    /// phase, say).
    #[must_use]
    pub fn metrics_handle(&self) -> ConsumerMetricsHandle {
        ConsumerMetricsHandle {
            counters: Arc::clone(&self.counters),
        }
    }

    /// The partitions assigned now, as `(topic, partition)`.
    #[must_use]
    pub fn assignment(&self) -> Vec<(String, i32)> {
        let mut out: Vec<(String, i32)> = lock(&self.books.partitions).keys().cloned().collect();
        out.sort();
        out
    }

    /// Stops: no further fetch; the handlers in flight get until `deadline`; what finished
    /// is committed; the consumer leaves the group. Returns the report.
    ///
    /// # Cancel safety
    ///
    /// The stop is requested when the future is first polled; dropping the future after that
    /// does not undo it, only loses the report.
    pub async fn stop(self, deadline: tokio::time::Instant) -> ConsumerReport {
        *lock(&self.control.deadline) = Some(deadline.into_std());
        self.control.stop.cancel();
        self.join().await
    }

    /// [`stop`](Self::stop) with a deadline `budget` from now.
    ///
    /// # Cancel safety
    ///
    /// As [`stop`](Self::stop).
    pub async fn stop_within(self, budget: Duration) -> ConsumerReport {
        let now = tokio::time::Instant::now();
        let deadline = now
            .checked_add(budget)
            .or_else(|| now.checked_add(Duration::from_secs(u64::from(u32::MAX))))
            .unwrap_or(now);
        self.stop(deadline).await
    }

    /// Waits until the consumer has stopped (its token cancelled, or a fatal error), and
    /// returns the report.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future changes nothing but the report's loss.
    pub async fn join(self) -> ConsumerReport {
        self.report.await.unwrap_or_else(|_| ConsumerReport {
            error: Some("the poll thread ended without a report".into()),
            ..ConsumerReport::failed()
        })
    }

    /// Registers a [`taskweave_shutdown`] phase named `name` that stops the consumer within
    /// the phase's deadline, reports what it gave up as abandoned, and logs the report.
    /// Returns `false` when the shutdown has started already (the consumer is then left
    /// running: cancel its token).
    pub fn register_phase(self, shutdown: &taskweave_shutdown::Shutdown, name: &str) -> bool {
        let name_owned = name.to_owned();
        shutdown.phase(name, move |ctx| async move {
            let report = self.stop(ctx.deadline()).await;
            for a in &report.abandoned {
                ctx.abandon(format!(
                    "{}/{}/{} ({:?})",
                    a.topic, a.partition, a.offset, a.reason
                ));
            }
            if let Err(error) = &report.final_commit {
                ctx.abandon(format!("final commit: {error}"));
            }
            tracing::info!(consumer = %name_owned, %report, "consumer stopped");
        })
    }
}
