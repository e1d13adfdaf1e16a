//! Helpers shared by the test modules.

use std::sync::Arc;

use taskweave_pool::PoolMetrics;
pub(crate) use taskweave_testkit::{alive_tasks, assert_no_leaked_tasks};
use tokio::sync::Semaphore;

/// A gate that handlers wait on; `open(n)` lets `n` of them through.
#[derive(Clone)]
pub(crate) struct Gate(Arc<Semaphore>);

impl Gate {
    pub(crate) fn closed() -> Self {
        Gate(Arc::new(Semaphore::new(0)))
    }

    pub(crate) fn open(&self, n: usize) {
        self.0.add_permits(n);
    }

    pub(crate) async fn pass(&self) {
        self.0.acquire().await.unwrap().forget();
    }
}

/// Every accepted job is accounted for exactly once:
/// `submitted == completed + failed + panicked + dropped + handed_back + abandoned`.
#[track_caller]
pub(crate) fn assert_books_balance(m: &PoolMetrics, context: &str) {
    assert_eq!(
        m.submitted,
        m.completed + m.failed + m.panicked + m.dropped + m.handed_back + m.abandoned,
        "{context}: {m:?}"
    );
}
