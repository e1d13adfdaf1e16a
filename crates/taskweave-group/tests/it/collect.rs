//! `CollectGroup`: every task runs, every failure is reported with its label.

use std::time::Duration;

use taskweave_group::{CollectGroup, SpawnError, TaskFailure};
use tokio_util::sync::CancellationToken;

use crate::support::{Concurrency, alive_tasks, assert_no_leaked_tasks};

#[tokio::test(start_paused = true)]
async fn every_failure_is_reported_with_its_label_in_spawn_order() {
    let baseline = alive_tasks();
    let mut group = CollectGroup::new(CancellationToken::new());
    // Later users finish first; the report is still in spawn order.
    for user in 1..=6_u64 {
        group
            .spawn(format!("user-{user}"), async move {
                tokio::time::sleep(Duration::from_millis(100 - user * 10)).await;
                match user {
                    2 => Err("mailbox full"),
                    5 => panic!("template error"),
                    _ => Ok(()),
                }
            })
            .await
            .unwrap();
    }
    let report = group.wait().await;
    assert_eq!(report.succeeded, 4);
    assert!(!report.is_success());
    let labels: Vec<&str> = report
        .failures
        .iter()
        .map(|(label, _)| label.as_str())
        .collect();
    assert_eq!(labels, ["user-2", "user-5"]);
    assert!(matches!(
        report.failures[0].1,
        TaskFailure::Failed("mailbox full")
    ));
    assert!(report.failures[1].1.is_panic());
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn a_failure_does_not_cancel_the_others() {
    let mut group = CollectGroup::new(CancellationToken::new());
    let token = group.token();
    group.spawn("fails", async { Err("no") }).await.unwrap();
    group
        .spawn("slow", async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if token.is_cancelled() {
                Err("cancelled")
            } else {
                Ok(())
            }
        })
        .await
        .unwrap();
    let report = group.wait().await;
    assert_eq!(report.succeeded, 1);
    assert_eq!(report.failures.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn with_limit_two_at_most_two_run_at_once_even_when_tasks_panic() {
    let concurrency = Concurrency::default();
    let mut group = CollectGroup::<u64, String>::new(CancellationToken::new()).with_limit(2);
    for n in 0..6_u64 {
        let concurrency = concurrency.clone();
        group
            .spawn(n, async move {
                let _inside = concurrency.enter();
                tokio::time::sleep(Duration::from_millis(10)).await;
                // A panic must free the slot like a normal end.
                assert!(n % 2 == 0, "task {n} exploded");
                Ok(())
            })
            .await
            .unwrap();
    }
    let report = group.wait().await;
    assert_eq!(report.succeeded, 3);
    assert_eq!(report.failures.len(), 3, "{report:?}");
    assert!(
        report
            .failures
            .iter()
            .all(|(_, failure)| failure.is_panic())
    );
    assert_eq!(concurrency.peak(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_limit_bounds_concurrency() {
    let concurrency = Concurrency::default();
    let mut group = CollectGroup::<usize, String>::new(CancellationToken::new()).with_limit(3);
    for n in 0..10 {
        let concurrency = concurrency.clone();
        group
            .spawn(n, async move {
                let _inside = concurrency.enter();
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(())
            })
            .await
            .unwrap();
    }
    assert_eq!(group.wait().await.succeeded, 10);
    assert_eq!(concurrency.peak(), 3);
}

#[tokio::test(start_paused = true)]
async fn cancelling_from_outside_refuses_new_spawns() {
    let parent = CancellationToken::new();
    let mut group = CollectGroup::<u8, String>::new(parent.clone());
    parent.cancel();
    assert!(matches!(
        group.try_spawn(1, async { Ok(()) }),
        Err(SpawnError::Cancelled(_))
    ));
    assert!(matches!(
        group.spawn(2, async { Ok(()) }).await,
        Err(SpawnError::Cancelled(_))
    ));
    assert!(group.wait().await.is_success());
}

#[tokio::test(start_paused = true)]
async fn dropping_the_group_cancels_and_aborts_its_tasks() {
    let baseline = alive_tasks();
    let mut group = CollectGroup::<u8, String>::new(CancellationToken::new());
    let token = group.token();
    group
        .spawn(1, async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        })
        .await
        .unwrap();
    drop(group);
    assert!(token.is_cancelled());
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn try_spawn_hands_the_future_back_when_full() {
    let mut group = CollectGroup::<u8, String>::new(CancellationToken::new()).with_limit(1);
    assert_eq!(group.limit(), Some(1));
    group
        .try_spawn(1, async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(())
        })
        .unwrap();
    assert!(matches!(
        group.try_spawn(2, async { Ok(()) }),
        Err(SpawnError::Full(_))
    ));
    assert_eq!(group.wait().await.succeeded, 1);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    // However tasks are timed and whichever fail or panic, no more than `limit` run at once
    // and every task is reported exactly once, failures in spawn order.
    #[test]
    fn the_limit_holds_and_every_task_is_reported(
        plans in proptest::collection::vec((0_u64..20, 0_u8..3), 0..30),
        limit in 1_usize..5,
    ) {
        let runtime = taskweave_testkit::paused_runtime();
        let total = plans.len();
        let (peak, report) = runtime.block_on(async move {
            let concurrency = Concurrency::default();
            let mut group = CollectGroup::<usize, String>::new(CancellationToken::new()).with_limit(limit);
            for (label, (ms, kind)) in plans.into_iter().enumerate() {
                let concurrency = concurrency.clone();
                group
                    .spawn(label, async move {
                        let _inside = concurrency.enter();
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        match kind {
                            0 => Ok(()),
                            1 => Err("failed".to_owned()),
                            _ => panic!("panicked"),
                        }
                    })
                    .await
                    .unwrap();
            }
            (concurrency.peak(), group.wait().await)
        });
        proptest::prop_assert!(peak <= limit);
        proptest::prop_assert_eq!(report.succeeded + report.failures.len(), total);
        let labels: Vec<usize> = report.failures.iter().map(|(label, _)| *label).collect();
        let mut sorted = labels.clone();
        sorted.sort_unstable();
        proptest::prop_assert_eq!(labels, sorted, "failures in spawn order");
    }
}

// The workspace's rule on zero limits (docs/architecture.md): it panics where it is set.
#[test]
#[should_panic(expected = "limit must be greater than zero")]
fn a_zero_limit_is_a_programmer_error() {
    let _ = CollectGroup::<u8, String>::new(CancellationToken::new()).with_limit(0);
}
