//! Reading a running consumer's counts: [`ConsumerMetricsHandle`], and the snapshot of
//! the counters it reads.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::partition::Counters;
use super::report::ConsumerMetrics;

/// Reads a consumer's counts while it runs
/// ([`RunningConsumer::metrics_handle`](crate::consume::RunningConsumer::metrics_handle)).
#[derive(Clone)]
pub struct ConsumerMetricsHandle {
    pub(super) counters: Arc<Counters>,
}

impl ConsumerMetricsHandle {
    /// The counts now.
    #[must_use]
    pub fn snapshot(&self) -> ConsumerMetrics {
        self.counters.snapshot()
    }
}

impl fmt::Debug for ConsumerMetricsHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ConsumerMetricsHandle")
            .field(&self.snapshot())
            .finish()
    }
}

impl Counters {
    pub(super) fn snapshot(&self) -> ConsumerMetrics {
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        ConsumerMetrics {
            handled: get(&self.handled),
            dead_lettered: get(&self.dead_lettered),
            failed_attempts: get(&self.failed_attempts),
            panics: get(&self.panics),
            commits: get(&self.commits),
            commit_failures: get(&self.commit_failures),
            assigned: get(&self.assigned),
            revoked: get(&self.revoked),
            pauses: get(&self.pauses),
            abandoned: get(&self.abandoned_total),
        }
    }
}
