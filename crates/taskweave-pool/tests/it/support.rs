//! Helpers shared by the test modules.

use std::sync::Arc;

use tokio::sync::Semaphore;

/// The number of tasks alive on the current runtime.
pub(crate) fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Asserts that the runtime is back to `baseline` alive tasks, after letting finished tasks be
/// released.
pub(crate) async fn assert_no_leaked_tasks(baseline: usize) {
    for _ in 0..32 {
        if alive_tasks() == baseline {
            return;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(alive_tasks(), baseline, "tasks leaked");
}

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
