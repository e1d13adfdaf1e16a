//! Helpers shared by the test modules.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
pub(crate) use taskweave_testkit::{alive_tasks, assert_no_leaked_tasks};

/// Counts how many tasks run at once and remembers the peak.
#[derive(Clone, Default)]
pub(crate) struct Concurrency {
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl Concurrency {
    pub(crate) fn enter(&self) -> Exit {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        Exit(Arc::clone(&self.running))
    }

    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }
}

/// Leaves the count when dropped, also when the task panics.
pub(crate) struct Exit(Arc<AtomicUsize>);

impl Drop for Exit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
