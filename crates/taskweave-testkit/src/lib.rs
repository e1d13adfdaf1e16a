//! Test helpers shared by the taskweave crates' integration tests: a dev-dependency only.
//!
//! # Example
//!
//! ```
//! use taskweave_testkit::{alive_tasks, assert_no_leaked_tasks};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let baseline = alive_tasks();
//! tokio::spawn(async {}).await.unwrap();
//! assert_no_leaked_tasks(baseline).await;
//! # }
//! ```

/// A current-thread runtime with time enabled and the clock paused, for tests (proptests
/// among them) that build their runtime by hand.
///
/// # Panics
///
/// Panics if the runtime cannot be built.
#[must_use]
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds")
}

/// The number of tasks alive on the current runtime.
///
/// # Panics
///
/// Panics outside a tokio runtime.
#[must_use]
pub fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Asserts that the runtime is back to `baseline` alive tasks, after letting tasks that have
/// finished be released (a task counts as alive until the runtime has processed its end).
///
/// On a multi-thread runtime a task may be finishing on another worker thread: there the
/// check also waits, in steps of a millisecond, for up to five seconds of wall time.
///
/// # Panics
///
/// Panics, failing the test, when tasks are still alive after 32 scheduling rounds (and, on
/// a multi-thread runtime, five seconds).
pub async fn assert_no_leaked_tasks(baseline: usize) {
    for _ in 0..32 {
        if alive_tasks() == baseline {
            return;
        }
        tokio::task::yield_now().await;
    }
    if tokio::runtime::Handle::current().runtime_flavor()
        == tokio::runtime::RuntimeFlavor::MultiThread
    {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while alive_tasks() != baseline && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(alive_tasks(), baseline, "tasks leaked");
}
