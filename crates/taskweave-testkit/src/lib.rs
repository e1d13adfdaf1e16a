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

/// A value that counts its drops in a shared counter: to check that every item a test hands
/// over is dropped exactly once (none leaked, none dropped twice).
#[derive(Debug)]
pub struct Counted(pub std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A value whose `Drop` panics: the hostile user value that tests hand to our tasks (as a
/// job's output or error, a panic payload, a key, or a guard held by a future).
#[derive(Debug)]
pub struct PanicOnDrop(pub &'static str);

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("{} panicked in its Drop", self.0);
    }
}

impl std::fmt::Display for PanicOnDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// A value whose `Display` panics.
#[derive(Debug)]
pub struct PanicOnDisplay;

impl std::fmt::Display for PanicOnDisplay {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        panic!("PanicOnDisplay was formatted")
    }
}

/// A future that is ready at once with `Ok(())` and panics when it is dropped afterwards:
/// the destructor of a user's future, run by whoever drops it.
#[derive(Debug)]
pub struct ReadyThenPanicOnDrop {
    _value: PanicOnDrop,
}

impl ReadyThenPanicOnDrop {
    /// A future whose drop panics with `name` in the message.
    #[must_use]
    pub fn new(name: &'static str) -> Self {
        ReadyThenPanicOnDrop {
            _value: PanicOnDrop(name),
        }
    }
}

impl std::future::Future for ReadyThenPanicOnDrop {
    type Output = Result<(), String>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::task::Poll::Ready(Ok(()))
    }
}
