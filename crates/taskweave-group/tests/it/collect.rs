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
