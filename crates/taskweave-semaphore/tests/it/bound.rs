//! `with_token`: a semaphore tied to a token closes when it is cancelled.

use taskweave_semaphore::{AcquireError, Semaphore, TryAcquireError};
use taskweave_testkit::{alive_tasks, assert_no_leaked_tasks};
use tokio_test::{assert_pending, assert_ready};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn cancelling_the_bound_token_closes_and_says_why_to_each_waiter() {
    let shutdown = CancellationToken::new();
    let request = CancellationToken::new();
    let child = shutdown.child_token();
    let semaphore = Semaphore::new(1).with_token(shutdown.clone());
    let held = semaphore.acquire(&shutdown).await.unwrap();

    let mut on_bound = tokio_test::task::spawn(semaphore.acquire(&shutdown));
    let mut on_request = tokio_test::task::spawn(semaphore.acquire_many(&request, 1));
    let mut on_child = tokio_test::task::spawn(semaphore.acquire(&child));
    assert_pending!(on_bound.poll());
    assert_pending!(on_request.poll());
    assert_pending!(on_child.poll());

    shutdown.cancel();
    // The watch task closes the semaphore when it runs.
    tokio::task::yield_now().await;
    assert!(semaphore.is_closed());
    assert!(on_bound.is_woken() && on_request.is_woken());
    assert_eq!(
        assert_ready!(on_bound.poll()).unwrap_err(),
        AcquireError::Cancelled
    );
    assert_eq!(
        assert_ready!(on_request.poll()).unwrap_err(),
        AcquireError::Closed
    );
    assert_eq!(
        assert_ready!(on_child.poll()).unwrap_err(),
        AcquireError::Cancelled
    );

    // Later requests fail at once; the permit held stays valid until dropped.
    assert_eq!(
        semaphore.acquire(&shutdown).await.unwrap_err(),
        AcquireError::Cancelled
    );
    assert_eq!(
        semaphore.acquire(&request).await.unwrap_err(),
        AcquireError::Closed
    );
    assert_eq!(
        semaphore.try_acquire().unwrap_err(),
        TryAcquireError::Closed
    );
    assert_eq!(semaphore.in_use(), 1);
    drop(held);
    assert_eq!(semaphore.in_use(), 0);
}

#[tokio::test]
async fn a_wait_on_the_bound_token_is_served_in_order() {
    let shutdown = CancellationToken::new();
    let semaphore = Semaphore::new(1).with_token(shutdown.clone());
    let held = semaphore.acquire(&shutdown).await.unwrap();
    let mut first = tokio_test::task::spawn(semaphore.acquire(&shutdown));
    let mut second = tokio_test::task::spawn(semaphore.acquire(&shutdown));
    assert_pending!(first.poll());
    assert_pending!(second.poll());
    drop(held);
    assert!(first.is_woken());
    let permit = assert_ready!(first.poll()).unwrap();
    assert_pending!(second.poll());
    drop(permit);
    drop(assert_ready!(second.poll()).unwrap());
}

#[tokio::test]
async fn tying_spawns_no_task_and_closes_inside_cancel() {
    let baseline = alive_tasks();
    let shutdown = CancellationToken::new();
    let semaphore = Semaphore::new(2).with_token(shutdown.clone());
    assert_eq!(
        alive_tasks(),
        baseline,
        "the watch is a waker on the token, not a task"
    );
    shutdown.cancel();
    assert!(semaphore.is_closed(), "closed before cancel() returned");
    assert_no_leaked_tasks(baseline).await;
}

#[test]
fn a_semaphore_can_be_tied_outside_a_runtime_and_outlive_every_runtime() {
    let shutdown = CancellationToken::new();
    let semaphore = Semaphore::new(1).with_token(shutdown.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let held = semaphore.acquire(&shutdown).await.unwrap();
        let mut waiter = tokio_test::task::spawn(semaphore.acquire(&shutdown));
        assert_pending!(waiter.poll());
        drop(held);
        drop(assert_ready!(waiter.poll()).unwrap());
    });
    // Made inside the runtime, polled after it is gone.
    let waiter = runtime.block_on(async { vec![semaphore.acquire_owned(&shutdown)] });
    let waiter = waiter.into_iter().next().unwrap();
    drop(runtime);
    // No runtime at all now: the cancellation still closes it and ends a wait.
    let mut waiter = tokio_test::task::spawn(waiter);
    let _held = assert_ready!(waiter.poll()).unwrap();
    let mut blocked = tokio_test::task::spawn(semaphore.acquire_owned(&shutdown));
    assert_pending!(blocked.poll());
    shutdown.cancel();
    assert!(blocked.is_woken());
    assert_eq!(
        assert_ready!(blocked.poll()).unwrap_err(),
        AcquireError::Cancelled
    );
}

#[tokio::test]
#[should_panic(expected = "already tied to a token")]
async fn tying_twice_is_a_programmer_error() {
    let _ = Semaphore::new(1)
        .with_token(CancellationToken::new())
        .with_token(CancellationToken::new());
}

#[tokio::test]
#[should_panic(expected = "tie the semaphore to its token before cloning it")]
async fn tying_after_cloning_is_a_programmer_error() {
    let semaphore = Semaphore::new(1);
    let _clone = semaphore.clone();
    let _ = semaphore.with_token(CancellationToken::new());
}
