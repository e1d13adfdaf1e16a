//! `TaskGroup`: first failure wins and cancels the rest; limits; panics; drop.

use std::future::Future;
use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use taskweave_group::{SpawnError, Spawner, TaskFailure, TaskGroup};
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
    let group = TaskGroup::new(CancellationToken::new());
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
    let group = TaskGroup::<String>::new(parent.clone());
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
    let group = TaskGroup::new(parent.clone());
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
    let group = TaskGroup::new(parent.clone());
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
    let group = TaskGroup::<String>::new(CancellationToken::new());
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
    let group = TaskGroup::<String>::new(CancellationToken::new()).with_limit(2);
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
    let group = TaskGroup::<String>::new(CancellationToken::new()).with_limit(1);
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
    let group = TaskGroup::<String>::new(CancellationToken::new()).with_limit(1);
    group
        .try_spawn(async {
            tokio::time::sleep(10 * MS).await;
            Ok(())
        })
        .unwrap();
    let refused = group.try_spawn(async { Ok(()) }).unwrap_err();
    assert!(matches!(refused, SpawnError::Full(_)));
    assert_eq!(refused.to_string(), "spawn refused: full");
    // The handed-back future is intact.
    refused.into_inner().await.unwrap();
    group.wait().await.unwrap();
}

// The workspace's rule (docs/architecture.md): a limit of zero is a configuration mistake and
// panics where it is set, in every crate (it used to refuse every spawn here and panic in
// the pool).
#[test]
#[should_panic(expected = "limit must be greater than zero")]
fn a_zero_limit_is_a_programmer_error() {
    let _ = TaskGroup::<String>::new(CancellationToken::new()).with_limit(0);
}

#[tokio::test(start_paused = true)]
async fn spawn_waits_for_a_slot_and_gives_up_when_the_group_is_cancelled() {
    let group = TaskGroup::new(CancellationToken::new()).with_limit(1);
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
    let group = TaskGroup::<String>::new(CancellationToken::new()).with_limit(1);
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
    let group = TaskGroup::<String>::new(CancellationToken::new());
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
    let group = TaskGroup::<String>::new(CancellationToken::new());
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
            let group = TaskGroup::new(CancellationToken::new()).with_limit(1);
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
    let group = TaskGroup::new(CancellationToken::new());
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
    let group = TaskGroup::<String>::new(CancellationToken::new());
    send(&group.spawn(async { Ok(()) }));
    send(&group.wait());
}

#[tokio::test(start_paused = true)]
async fn a_task_whose_future_panics_in_its_destructor_still_cancels_the_siblings() {
    let group = TaskGroup::<String>::new(CancellationToken::new());
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

/// A task that spawns `fanout` children down to `depth`, counting every task that ran.
fn tree(
    spawner: Spawner<String>,
    ran: Arc<AtomicUsize>,
    depth: u32,
    fanout: u32,
) -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
    Box::pin(async move {
        ran.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(MS).await;
        if depth > 0 {
            for _ in 0..fanout {
                let child = tree(spawner.clone(), Arc::clone(&ran), depth - 1, fanout);
                spawner
                    .spawn(child)
                    .await
                    .map_err(|refused| refused.to_string())?;
            }
        }
        Ok(())
    })
}

#[tokio::test(start_paused = true)]
async fn tasks_spawn_siblings_and_wait_waits_for_every_one() {
    let baseline = alive_tasks();
    let ran = Arc::new(AtomicUsize::new(0));
    let group = TaskGroup::new(CancellationToken::new());
    group
        .spawn(tree(group.spawner(), Arc::clone(&ran), 4, 3))
        .await
        .unwrap();
    group.wait().await.unwrap();
    // 1 + 3 + 9 + 27 + 81: every level, spawned from inside the tasks, was waited for.
    assert_eq!(ran.load(Ordering::SeqCst), 121);
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn a_sibling_failure_cancels_the_whole_tree_and_wins() {
    let group = TaskGroup::<String>::new(CancellationToken::new());
    let spawner = group.spawner();
    let token = group.token();
    group
        .spawn(async move {
            spawner
                .spawn(async { Err("child failed".to_owned()) })
                .await
                .unwrap();
            token.cancelled().await;
            Err("parent: cancelled".to_owned())
        })
        .await
        .unwrap();
    let failures = group.wait_all().await.unwrap_err();
    let messages: Vec<String> = failures.iter().map(ToString::to_string).collect();
    assert_eq!(messages, ["child failed", "parent: cancelled"]);
}

#[tokio::test(start_paused = true)]
async fn a_spawner_refuses_once_the_group_was_waited_for_or_dropped() {
    let group = TaskGroup::<String>::new(CancellationToken::new());
    let spawner = group.spawner();
    group.wait().await.unwrap();
    let refused = spawner.try_spawn(async { Ok(()) }).unwrap_err();
    assert!(matches!(refused, SpawnError::Cancelled(_)));
    assert!(matches!(
        spawner.spawn(async { Ok(()) }).await,
        Err(SpawnError::Cancelled(_))
    ));

    let baseline = alive_tasks();
    let group = TaskGroup::<String>::new(CancellationToken::new());
    let spawner = group.spawner();
    spawner
        .spawn(async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        })
        .await
        .unwrap();
    drop(group);
    // The spawner keeps the group's books alive, not its tasks: they were aborted.
    assert_no_leaked_tasks(baseline).await;
    assert!(spawner.try_spawn(async { Ok(()) }).is_err());
}

#[tokio::test(start_paused = true)]
async fn wait_all_reports_every_failure_first_by_time_first() {
    let group = TaskGroup::new(CancellationToken::new());
    for (ms, message) in [(30, "third"), (10, "first"), (1_000, "slow")] {
        group
            .spawn(fail_after(group.token(), ms, message))
            .await
            .unwrap();
    }
    let failures = group.wait_all().await.unwrap_err();
    let mut messages: Vec<String> = failures.iter().map(ToString::to_string).collect();
    // "first" at 10 ms cancelled the others, which answered at once (in the order the token
    // woke them, which is tokio's business).
    assert_eq!(messages[0], "first");
    messages[1..].sort();
    assert_eq!(messages, ["first", "slow: cancelled", "third: cancelled"]);

    let group = TaskGroup::<String>::new(CancellationToken::new());
    group.spawn(async { Ok(()) }).await.unwrap();
    assert!(group.wait_all().await.is_ok());
}

/// How many tasks the group holds, read without reaping (`len` reaps first): its `Debug`.
fn held<E: Send + 'static>(group: &TaskGroup<E>) -> usize {
    let debug = format!("{group:?}");
    let tasks = debug
        .split("tasks: ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .expect("TaskGroup's Debug names its tasks");
    tasks.parse().unwrap()
}

// Issue 20: finished tasks used to stay in the group's `JoinSet` until `wait`, so a group
// that lives as long as a service grew with every task it ever ran. The size is read without
// reaping, so that only the reaping at each spawn can keep it flat.
#[tokio::test(start_paused = true)]
async fn a_long_lived_group_stays_flat_over_100_000_short_tasks() {
    const TASKS: usize = 100_000;
    let ran = Arc::new(AtomicUsize::new(0));
    // With a limit: spawn waits for a slot, and the tasks run meanwhile.
    let group = TaskGroup::<String>::new(CancellationToken::new()).with_limit(16);
    let mut largest = 0;
    for _ in 0..TASKS {
        let ran = Arc::clone(&ran);
        group
            .spawn(async move {
                ran.fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
            .await
            .unwrap();
        largest = largest.max(held(&group));
    }
    // 16 running, and at most the one that just freed its slot and has not been reaped.
    assert!(largest <= 17, "the group held {largest} tasks at once");
    group.wait().await.unwrap();
    assert_eq!(ran.load(Ordering::Relaxed), TASKS);

    // Without a limit, in a service that yields between requests.
    let group = TaskGroup::<String>::new(CancellationToken::new());
    let mut largest = 0;
    for _ in 0..TASKS {
        group.try_spawn(async { Ok(()) }).unwrap();
        tokio::task::yield_now().await;
        largest = largest.max(held(&group));
    }
    assert!(largest <= 2, "the group held {largest} tasks at once");
    group.wait().await.unwrap();
}

// Review of issue 20: a limit set after a task ran (and was reaped) used to be accepted.
#[tokio::test]
#[should_panic(expected = "set the limit before the first spawn")]
async fn a_limit_after_a_finished_task_is_still_a_programmer_error() {
    let group = TaskGroup::<String>::new(CancellationToken::new());
    group.try_spawn(async { Ok(()) }).unwrap();
    tokio::task::yield_now().await;
    assert_eq!(group.len(), 0, "finished and reaped");
    let _ = group.with_limit(2);
}

/// A future that, when dropped, spawns into its group a future that does the same, `depth`
/// more times: user code in `Drop` that re-enters the group.
struct SpawnsOnDrop {
    spawner: Option<Spawner<String>>,
    depth: u32,
    drops: Arc<AtomicUsize>,
}

impl Future for SpawnsOnDrop {
    type Output = Result<(), String>;
    fn poll(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::task::Poll::Pending
    }
}

impl Drop for SpawnsOnDrop {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
        if let Some(spawner) = self.spawner.take()
            && self.depth > 0
        {
            let next = SpawnsOnDrop {
                spawner: Some(spawner.clone()),
                depth: self.depth - 1,
                drops: Arc::clone(&self.drops),
            };
            let _ = spawner.try_spawn(next);
        }
    }
}

// Review of issue 20: on a runtime that is shutting down, tokio drops a new task's future
// inside `spawn`, which the group calls under its lock; a `Drop` that spawns into the group
// again used to deadlock there. The future is now dropped after the lock is released.
#[test]
fn a_drop_that_spawns_into_the_group_while_the_runtime_shuts_down_does_not_deadlock() {
    let drops = Arc::new(AtomicUsize::new(0));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let group = runtime.block_on(async {
        let group = TaskGroup::<String>::new(CancellationToken::new());
        group
            .try_spawn(SpawnsOnDrop {
                spawner: Some(group.spawner()),
                depth: 3,
                drops: Arc::clone(&drops),
            })
            .unwrap();
        tokio::task::yield_now().await; // the task is pending
        group
    });
    // The runtime drops the pending task; its `Drop` spawns, tokio drops that task at once
    // (inside `spawn`), whose `Drop` spawns again, three times.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let dropper = std::thread::spawn(move || {
        drop(runtime);
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the runtime's shutdown deadlocked in the group");
    dropper.join().unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 4);
    drop(group);
}
