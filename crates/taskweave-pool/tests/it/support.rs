//! Helpers shared by the test modules.

use std::sync::Arc;

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
