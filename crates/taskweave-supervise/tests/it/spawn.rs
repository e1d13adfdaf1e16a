//! `spawn` and `TaskHandle`: named tasks whose panics are captured, on both runtimes.

use std::time::Duration;

use taskweave_supervise::{TaskError, spawn};
use tokio::sync::oneshot;

use crate::support::{LogCapture, alive_tasks, assert_no_leaked_tasks};

#[tokio::test]
async fn output_is_returned_to_the_awaiter() {
    let task = spawn("adder", async { 40 + 2 });
    assert_eq!(task.name(), "adder");
    assert_eq!(task.await.unwrap(), 42);
}

#[tokio::test]
async fn panic_is_returned_as_a_typed_error() {
    let error = spawn("worker", async { panic!("boom") }).await.unwrap_err();
    assert!(error.is_panic());
    assert_eq!(error.name(), "worker");
    let panic = error.into_panic().unwrap();
    assert_eq!(panic.message(), "boom");
    assert!(panic.location().unwrap().contains("tests/it/spawn.rs"));
}

// Reference behaviour: `safeGo("worker", panic)` then "main is still running".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detached_panic_is_logged_and_the_other_tasks_keep_running() {
    let logs = LogCapture::global();
    let (done_tx, done_rx) = oneshot::channel();
    let survivor = spawn("survivor", async move {
        done_rx.await.unwrap();
        "still running"
    });
    let detached = spawn("detached", async { panic!("nobody awaits me") });
    // Wait for the panic without awaiting its handle, then drop the handle.
    while !detached.is_finished() {
        tokio::task::yield_now().await;
    }
    drop(detached);
    done_tx.send(()).unwrap();
    assert_eq!(survivor.await.unwrap(), "still running");
    let text = logs.lines_with("task=detached");
    assert!(text.contains("ERROR"), "{text}");
    assert!(text.contains("panic=nobody awaits me"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn abort_yields_aborted_with_the_name() {
    let baseline = alive_tasks();
    let task = spawn("sleeper", tokio::time::sleep(Duration::from_secs(60)));
    task.abort();
    match task.await {
        Err(TaskError::Aborted { name }) => assert_eq!(name, "sleeper"),
        other => panic!("expected Aborted, got {other:?}"),
    }
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test]
async fn an_aborted_task_whose_drop_panics_is_aborted_and_the_panic_logged() {
    struct PanicsOnDrop;
    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            if !std::thread::panicking() {
                panic!("drop exploded");
            }
        }
    }
    let logs = LogCapture::global();
    let task = spawn("dropper-aborted", async {
        let guard = PanicsOnDrop;
        std::future::pending::<()>().await;
        drop(guard);
    });
    tokio::task::yield_now().await;
    task.abort();
    // The abort is what the handle says, as a supervisor's books do for the same task; the
    // destructor's panic is caught inside the drop and logged, never silent.
    let error = task.await.unwrap_err();
    assert!(
        matches!(&error, TaskError::Aborted { name } if name == "dropper-aborted"),
        "{error:?}"
    );
    let logged = logs.lines_with("dropper-aborted");
    assert!(
        logged.contains("dropping the unfinished task panicked")
            && logged.contains("drop exploded"),
        "{logged}"
    );
    assert!(
        logged.contains("tests/it/spawn.rs"),
        "with its location: {logged}"
    );
}

#[tokio::test]
async fn awaiting_a_handle_is_cancel_safe() {
    let (tx, rx) = oneshot::channel::<u8>();
    let mut task = spawn("waiter", async move { rx.await.unwrap() });
    // A select that gives up on the handle does not lose the result.
    tokio::select! {
        biased;
        _ = &mut task => panic!("not ready yet"),
        () = tokio::task::yield_now() => {}
    }
    tx.send(9).unwrap();
    assert_eq!(task.await.unwrap(), 9);
}

#[test]
#[should_panic(expected = "must be called from the context of a Tokio 1.x runtime")]
fn spawn_outside_a_runtime_panics() {
    drop(spawn("nowhere", async {}));
}

#[tokio::test]
async fn a_panic_an_aborted_tasks_destructor_catches_itself_is_logged_under_its_name() {
    struct CatchesInDrop;
    impl Drop for CatchesInDrop {
        fn drop(&mut self) {
            let caught = std::panic::catch_unwind(|| panic!("caught in drop"));
            assert!(caught.is_err());
        }
    }
    let logs = LogCapture::global();
    let task = spawn("drop-catcher", async {
        let guard = CatchesInDrop;
        std::future::pending::<()>().await;
        drop(guard);
    });
    tokio::task::yield_now().await;
    task.abort();
    assert!(matches!(task.await, Err(TaskError::Aborted { .. })));
    let logged = logs.lines_with("drop-catcher");
    assert!(
        logged.contains("a panic was caught while dropping the task")
            && logged.contains("caught in drop"),
        "{logged}"
    );
}
