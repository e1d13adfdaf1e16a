//! What every bench file shares: the two runtimes each comparison runs on.

use tokio::runtime::{Builder, Runtime};

/// A current-thread runtime and a multi-thread runtime with 2 workers (the machine's cores),
/// each named for the benchmark ids.
pub(crate) fn runtimes() -> [(&'static str, Runtime); 2] {
    let current = Builder::new_current_thread().build().unwrap();
    let multi = Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    [("current_thread", current), ("multi_thread_2", multi)]
}
