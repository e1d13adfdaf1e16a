//! The very end: shutting the runtime down without hanging on a stray blocking task.

use std::future::Future;
use std::time::Duration;

use tokio::runtime::Runtime;

/// Runs `main` on `runtime`, then shuts the runtime down, waiting at most `timeout` for its
/// tasks: a blocking task that never returns (a `spawn_blocking` stuck in I/O) cannot keep
/// the process alive. Use it in place of `#[tokio::main]`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
/// let code = taskweave_shutdown::block_on(runtime, Duration::from_millis(100), async {
///     // A stray blocking task that would otherwise keep the process alive.
///     tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_secs(3600)));
///     0
/// });
/// assert_eq!(code, 0);
/// ```
///
/// # Panics
///
/// Panics when called from inside a runtime (as `Runtime::block_on` does).
pub fn block_on<F: Future>(runtime: Runtime, timeout: Duration, main: F) -> F::Output {
    let output = runtime.block_on(main);
    runtime.shutdown_timeout(timeout);
    output
}
