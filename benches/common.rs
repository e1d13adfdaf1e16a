//! What the bench files share: the two runtimes each comparison runs on, and running a
//! comparison's work in a task of the runtime.

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

/// Runs `work` in a task of the runtime instead of on the thread that calls `block_on`.
#[allow(dead_code, reason = "used by the pool and pipeline benches only")]
pub(crate) async fn in_task<F>(work: F) -> u64
where
    F: Future<Output = u64> + Send + 'static,
{
    tokio::spawn(work).await.expect("the work does not panic")
}
