//! `TaskGroup`: first failure wins and cancels the rest; limits; panics; drop.

use std::time::Duration;

use taskweave_group::{SpawnError, TaskFailure, TaskGroup};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::support::{Concurrency, alive_tasks, assert_no_leaked_tasks};

const MS: Duration = Duration::from_millis(1);

/// A task that fails after `ms` with `message`, or reports cancellation if the group's token
/// is cancelled first.
async fn fail_after(
    token: CancellationToken,
    ms: u64,
    message: &'static str,
) -> Result<(), String> {
    tokio::select! {
        () = token.cancelled() => Err(format!("{message}: cancelled")),
        () = tokio::time::sleep(Duration::from_millis(ms)) => Err(message.to_owned()),
    }
}

#[tokio::test(start_paused = true)]
async fn the_first_failure_by_time_wins_over_later_and_cancellation_errors() {
    let baseline = alive_tasks();
    let mut group = TaskGroup::new(CancellationToken::new());
    // Spawned in an order unrelated to their timing; "second" fails at 20 ms and wins.
    for (ms, message) in [
        (50, "fourth"),
        (20, "second"),
        (30, "third"),
        (1_000, "slow"),
    ] {
        group
            .spawn(fail_after(group.token(), ms, message))
            .await
            .unwrap();
    }
    let started = Instant::now();
    let failure = group.wait().await.unwrap_err();
    assert!(
        matches!(&failure, TaskFailure::Failed(message) if message == "second"),
        "{failure}"
    );
    assert_eq!(
        started.elapsed(),
        20 * MS,
        "the others were cancelled at once"
    );
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn success_returns_ok_and_the_token_is_cancelled_when_wait_returns() {
    let parent = CancellationToken::new();
    let mut group = TaskGroup::<String>::new(parent.clone());
    let token = group.token();
    for ms in [10, 20, 30] {
        group
            .spawn(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(())
            })
            .await
            .unwrap();
    }
    assert!(!token.is_cancelled());
    group.wait().await.unwrap();
    assert!(token.is_cancelled(), "cancelled on return, even on success");
    assert!(!parent.is_cancelled(), "never the parent");
}

#[tokio::test(start_paused = true)]
async fn tasks_see_the_groups_token_not_the_parents() {
    let parent = CancellationToken::new();
    let mut group = TaskGroup::new(parent.clone());
    let watcher = group.token();
    group.spawn(async { Err("boom") }).await.unwrap();
    group
        .spawn(async move {
            watcher.cancelled().await;
            Ok(())
        })
        .await
        .unwrap();
    assert!(matches!(
        group.wait().await,
        Err(TaskFailure::Failed("boom"))
    ));
    assert!(!parent.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn parent_cancellation_reaches_the_tasks() {
    let parent = CancellationToken::new();
    let mut group = TaskGroup::new(parent.clone());
    group
        .spawn(fail_after(group.token(), 1_000, "work"))
        .await
        .unwrap();
    parent.cancel();
    let failure = group.wait().await.unwrap_err();
    assert!(matches!(&failure, TaskFailure::Failed(message) if message == "work: cancelled"));
}

#[tokio::test(start_paused = true)]
async fn a_panicking_task_is_a_failure_with_its_message_and_wait_does_not_panic() {
    let mut group = TaskGroup::<String>::new(CancellationToken::new());
    let token = group.token();
    group
        .spawn(async { panic!("index out of range") })
        .await
        .unwrap();
    group
        .spawn(async move {
            token.cancelled().await;
            Err("sibling cancelled".to_owned())
        })
        .await
        .unwrap();
    match group.wait().await {
        Err(TaskFailure::Panicked(panic)) => {
            assert_eq!(panic.message(), "index out of range");
            assert!(panic.location().is_some());
            assert_eq!(
                panic.backtrace().status(),
                std::backtrace::BacktraceStatus::Captured
            );
        }
        other => panic!("expected the panic, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn with_limit_two_at_most_two_run_at_once() {
    let concurrency = Concurrency::default();
    let mut group = TaskGroup::<String>::new(CancellationToken::new()).with_limit(2);
    assert_eq!(group.limit(), Some(2));
    let started = Instant::now();
    for _ in 0..6 {
        let concurrency = concurrency.clone();
        group
            .spawn(async move {
                let _inside = concurrency.enter();
                tokio::time::sleep(10 * MS).await;
                Ok(())
            })
            .await
            .unwrap();
    }
    group.wait().await.unwrap();
    assert_eq!(concurrency.peak(), 2);
    assert_eq!(started.elapsed(), 30 * MS, "three rounds of two");
}

#[tokio::test(start_paused = true)]
async fn a_panicking_task_fails_the_group_and_later_spawns_are_refused() {
    let mut group = TaskGroup::<String>::new(CancellationToken::new()).with_limit(1);
    group.spawn(async { panic!("first") }).await.unwrap();
    // Once it has panicked, the group is cancelled: a spawn is refused as Cancelled, not
    // Full. (That the panic frees its slot is shown with `CollectGroup`, which shares the
    // slot logic and keeps running after failures.)
    tokio::task::yield_now().await;
    assert!(matches!(
        group.try_spawn(async { Ok(()) }),
        Err(SpawnError::Cancelled(_))
    ));
    assert!(group.wait().await.unwrap_err().is_panic());
}

#[tokio::test(start_paused = true)]
async fn try_spawn_hands_the_future_back_when_full() {
    let mut group = TaskGroup::<String>::new(CancellationToken::new()).with_limit(1);
    group
        .try_spawn(async {
            tokio::time::sleep(10 * MS).await;
            Ok(())
        })
        .unwrap();
    let refused = group.try_spawn(async { Ok(()) }).unwrap_err();
    assert!(matches!(refused, SpawnError::Full(_)));
    assert_eq!(refused.to_string(), "group full");
    // The handed-back future is intact.
    refused.into_inner().await.unwrap();
    group.wait().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_zero_limit_refuses_every_spawn_instead_of_hanging() {
    let mut group = TaskGroup::<String>::new(CancellationToken::new()).with_limit(0);
    assert!(matches!(
        group.try_spawn(async { Ok(()) }),
        Err(SpawnError::Full(_))
    ));
    assert!(matches!(
        group.spawn(async { Ok(()) }).await,
        Err(SpawnError::Full(_))
    ));
    group.wait().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn spawn_waits_for_a_slot_and_gives_up_when_the_group_is_cancelled() {
    let mut group = TaskGroup::new(CancellationToken::new()).with_limit(1);
    group
        .spawn(async {
            tokio::time::sleep(10 * MS).await;
            Err("first")
        })
        .await
        .unwrap();
    // The only slot is taken; the failure at 10 ms cancels the group while we wait.
    let started = Instant::now();
    let refused = group.spawn(async { Ok(()) }).await.unwrap_err();
    assert!(matches!(refused, SpawnError::Cancelled(_)));
    assert_eq!(started.elapsed(), 10 * MS);
    assert!(matches!(
        group.try_spawn(async { Ok(()) }),
        Err(SpawnError::Cancelled(_))
    ));
    assert!(matches!(
        group.wait().await,
        Err(TaskFailure::Failed("first"))
    ));
}

#[tokio::test(start_paused = true)]
async fn spawn_waits_for_a_free_slot() {
    let mut group = TaskGroup::<String>::new(CancellationToken::new()).with_limit(1);
    group
        .spawn(async {
            tokio::time::sleep(30 * MS).await;
            Ok(())
        })
        .await
        .unwrap();
    let started = Instant::now();
    group.spawn(async { Ok(()) }).await.unwrap();
    assert_eq!(started.elapsed(), 30 * MS);
    group.wait().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn dropping_the_group_cancels_and_aborts_its_tasks() {
    let baseline = alive_tasks();
    let mut group = TaskGroup::<String>::new(CancellationToken::new());
    let token = group.token();
    for _ in 0..3 {
        group
            .spawn(async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(())
            })
            .await
            .unwrap();
    }
    assert_eq!(group.len(), 3);
    drop(group);
    assert!(token.is_cancelled());
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test]
#[should_panic(expected = "set the limit before the first spawn")]
async fn setting_a_limit_after_spawning_is_a_programmer_error() {
    let mut group = TaskGroup::<String>::new(CancellationToken::new());
    group.try_spawn(async { Ok(()) }).unwrap();
    let _ = group.with_limit(2);
}

// Regression (review of issue 7): a failing task used to free its slot before cancelling the
// group, so a spawn waiting for that slot could start a task after the failure.
#[test]
fn a_spawn_waiting_for_a_slot_never_starts_after_a_failure() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    for _ in 0..200 {
        runtime.block_on(async {
            let mut group = TaskGroup::new(CancellationToken::new()).with_limit(1);
            group.spawn(async { Err("first") }).await.unwrap();
            let refused = group
                .spawn(async { Err("started after the failure") })
                .await;
            assert!(matches!(refused, Err(SpawnError::Cancelled(_))));
            assert!(matches!(
                group.wait().await,
                Err(TaskFailure::Failed("first"))
            ));
        });
    }
}

#[tokio::test(start_paused = true)]
async fn a_later_failure_that_ignores_the_token_does_not_replace_the_first() {
    let mut group = TaskGroup::new(CancellationToken::new());
    group
        .spawn(async {
            tokio::time::sleep(30 * MS).await;
            Err("late, deaf to the token")
        })
        .await
        .unwrap();
    group
        .spawn(async {
            tokio::time::sleep(10 * MS).await;
            Err("first")
        })
        .await
        .unwrap();
    assert!(matches!(
        group.wait().await,
        Err(TaskFailure::Failed("first"))
    ));
}

#[test]
fn the_group_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let mut group = TaskGroup::<String>::new(CancellationToken::new());
    send(&group.spawn(async { Ok(()) }));
    send(&group.wait());
}

#[tokio::test(start_paused = true)]
async fn a_task_whose_future_panics_in_its_destructor_still_cancels_the_siblings() {
    let mut group = TaskGroup::<String>::new(CancellationToken::new());
    let token = group.token();
    group
        .spawn(async move {
            token.cancelled().await;
            Ok(())
        })
        .await
        .unwrap();
    group
        .spawn(taskweave_testkit::ReadyThenPanicOnDrop::new(
            "the task's future",
        ))
        .await
        .unwrap();
    // Without the catch around the destructor, the sibling waits for a cancellation that
    // never comes and `wait` hangs.
    let failure = tokio::time::timeout(Duration::from_secs(5), group.wait())
        .await
        .expect("the group did not hang")
        .unwrap_err();
    assert!(matches!(failure, TaskFailure::Panicked(_)), "{failure:?}");
}
