//! Every public type is `Send + Sync` (and `Unpin` where documented), so it can cross tasks.

use std::future::Ready;

use taskweave_supervise::{
    CatchPanic, DrainReport, Escalation, Failure, PanicError, RestartError, RestartPolicy,
    SpawnError, Supervisor, SupervisorMetrics, TaskError, TaskHandle, TaskName,
};

fn send_sync_unpin<T: Send + Sync + Unpin>() {}
fn send_sync<T: Send + Sync>() {}

#[test]
fn public_types_are_send_sync_and_unpin() {
    send_sync_unpin::<Supervisor>();
    send_sync_unpin::<TaskHandle<u32>>();
    send_sync_unpin::<TaskName>();
    send_sync_unpin::<PanicError>();
    send_sync_unpin::<TaskError>();
    send_sync_unpin::<SpawnError<Ready<()>>>();
    send_sync_unpin::<DrainReport>();
    send_sync_unpin::<SupervisorMetrics>();
    send_sync_unpin::<Escalation>();
    send_sync_unpin::<RestartPolicy>();
    send_sync_unpin::<Failure<String>>();
    send_sync_unpin::<RestartError<String>>();
    send_sync_unpin::<CatchPanic<Ready<()>>>();
    // The futures of `shutdown` and `wait` can be awaited inside spawned tasks.
    fn send_future<F: std::future::Future + Send>(_: F) {}
    let supervisor = Supervisor::new(tokio_util::sync::CancellationToken::new());
    send_future(supervisor.shutdown(std::time::Duration::from_secs(1)));
    send_future(supervisor.wait());
    // A caught panic can be carried out of a `catch_unwind` of the caller's own, and is one
    // pointer wide, so `Result`s and channels carrying it stay small.
    fn unwind_safe<T: std::panic::UnwindSafe + std::panic::RefUnwindSafe>() {}
    unwind_safe::<PanicError>();
    assert_eq!(
        std::mem::size_of::<PanicError>(),
        std::mem::size_of::<usize>()
    );
    // Errors must work with `Box<dyn Error + Send + Sync>` and `anyhow`.
    send_sync::<Box<dyn std::error::Error + Send + Sync>>();
    let _: Box<dyn std::error::Error + Send + Sync> = Box::new(TaskError::Aborted {
        name: TaskName::from("x"),
    });
}
