//! `spawn_restarting` and `RestartPolicy`: backoff, intensity limit, escalation, stop.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use taskweave_supervise::{Failure, RestartError, RestartPolicy, Supervisor};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);

fn policy(max_restarts: u32) -> RestartPolicy {
    RestartPolicy::new(max_restarts, Duration::from_secs(10)).with_backoff(100 * MS, 400 * MS)
}

#[tokio::test(start_paused = true)]
async fn failed_runs_restart_with_exponential_backoff_until_one_succeeds() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let origin = Instant::now();
    let starts = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&starts);
    let task = supervisor
        .spawn_restarting("flaky", policy(10), move |_token| {
            let recorded = Arc::clone(&recorded);
            async move {
                let mut starts = recorded.lock().await;
                starts.push(origin.elapsed());
                if starts.len() < 5 {
                    Err("refused")
                } else {
                    Ok(())
                }
            }
        })
        .unwrap();
    task.await.unwrap().unwrap();
    // Backoffs 100, 200, 400, 400 (capped) between the five runs.
    assert_eq!(
        *starts.lock().await,
        [0, 100, 300, 700, 1100].map(|ms| ms * MS)
    );
    let metrics = supervisor.metrics();
    assert_eq!((metrics.restarts, metrics.completed), (4, 1));
    assert!(supervisor.escalation().is_none());
}

#[tokio::test(start_paused = true)]
async fn panicking_runs_are_restarted_too() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let runs = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&runs);
    let task = supervisor
        .spawn_restarting("exploding", policy(3), move |_token| {
            let run = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                assert!(run >= 2, "bad input on run {run}");
                Ok::<(), String>(())
            }
        })
        .unwrap();
    task.await.unwrap().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(supervisor.metrics().restarts, 2);
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_the_factory_itself_is_a_failed_run_and_is_restarted() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let mut calls = 0;
    let task = supervisor
        .spawn_restarting("config-reader", policy(3), move |_token| {
            calls += 1;
            assert!(calls > 1, "config missing on the first read");
            async { Ok::<(), String>(()) }
        })
        .unwrap();
    task.await.unwrap().unwrap();
    assert_eq!(supervisor.metrics().restarts, 1);
}

#[tokio::test(start_paused = true)]
async fn exceeding_the_intensity_limit_escalates_and_cancels_the_supervisor() {
    let parent = CancellationToken::new();
    let supervisor = Supervisor::new(parent.clone());
    let bystander_token = supervisor.token();
    let bystander = supervisor
        .spawn(
            "bystander",
            async move { bystander_token.cancelled().await },
        )
        .unwrap();
    let task = supervisor
        .spawn_restarting("doomed", policy(2), |_token| async { Err("db down") })
        .unwrap();
    let error = task.await.unwrap().unwrap_err();
    match &error {
        RestartError::GaveUp {
            name,
            restarts,
            last,
        } => {
            assert_eq!(name, "doomed");
            assert_eq!(*restarts, 2);
            assert!(matches!(last, Failure::Error("db down")));
        }
        other => panic!("expected GaveUp, got {other}"),
    }
    assert_eq!(
        error.to_string(),
        "task `doomed` gave up after 2 restarts: db down"
    );
    let escalation = supervisor.escalation().expect("escalation recorded");
    assert_eq!(escalation.task, "doomed");
    assert_eq!(escalation.last_failure, "db down");
    assert!(supervisor.token().is_cancelled());
    assert!(
        !parent.is_cancelled(),
        "escalation stops the supervisor, not its parent"
    );
    bystander.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn restarts_older_than_the_window_do_not_count() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let runs = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&runs);
    // One restart allowed per second; each run lives 2 s before failing, so every failure
    // finds the previous restart outside the window and the task is never given up.
    let policy = RestartPolicy::new(1, Duration::from_secs(1)).with_backoff(MS, MS);
    let task = supervisor
        .spawn_restarting("slow-failer", policy, move |_token| {
            let run = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                if run < 4 {
                    Err("lost connection")
                } else {
                    Ok(())
                }
            }
        })
        .unwrap();
    task.await.unwrap().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 5);
    assert!(supervisor.escalation().is_none());
}

#[tokio::test(start_paused = true)]
async fn zero_restarts_gives_up_at_the_first_failure() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let task = supervisor
        .spawn_restarting("once", policy(0), |_token| async { Err("no") })
        .unwrap();
    assert!(matches!(
        task.await.unwrap(),
        Err(RestartError::GaveUp { restarts: 0, .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn shutdown_during_backoff_stops_restarting_at_once() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let task = supervisor
        .spawn_restarting(
            "retrying",
            RestartPolicy::new(10, Duration::from_secs(60))
                .with_backoff(Duration::from_secs(30), Duration::from_secs(30)),
            |_token| async { Err("unavailable") },
        )
        .unwrap();
    tokio::time::sleep(MS).await;
    let started = Instant::now();
    let report = supervisor.shutdown(Duration::from_secs(1)).await;
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "the backoff does not delay the drain"
    );
    assert_eq!(
        report.failed,
        ["retrying"],
        "it ended without a successful run"
    );
    assert_eq!(supervisor.metrics().failed, 1);
    assert!(matches!(
        task.await.unwrap(),
        Err(RestartError::Cancelled { .. })
    ));
    assert!(supervisor.escalation().is_none());
}

#[tokio::test(start_paused = true)]
async fn runs_get_a_token_that_the_shutdown_cancels() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let task = supervisor
        .spawn_restarting("consumer", policy(3), |token| async move {
            token.cancelled().await;
            Ok::<(), String>(())
        })
        .unwrap();
    let report = supervisor.shutdown(Duration::from_secs(1)).await;
    assert!(report.is_clean());
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn spawn_restarting_after_close_hands_the_factory_back() {
    let supervisor = Supervisor::new(CancellationToken::new());
    supervisor.close();
    let refused = supervisor
        .spawn_restarting("late", policy(1), |_token| async { Ok::<(), String>(()) })
        .unwrap_err();
    let mut make = refused.into_inner();
    assert!(make(CancellationToken::new()).await.is_ok());
}

#[test]
#[should_panic(expected = "window must be greater than zero")]
fn zero_window_is_a_programmer_error() {
    let _ = RestartPolicy::new(3, Duration::ZERO);
}

#[test]
#[should_panic(expected = "must not be smaller than initial")]
fn backoff_cap_below_the_initial_backoff_is_a_programmer_error() {
    let _ = RestartPolicy::new(3, Duration::from_secs(1)).with_backoff(2 * MS, MS);
}

#[test]
fn backoff_doubles_and_saturates() {
    let policy = RestartPolicy::new(3, Duration::from_secs(1))
        .with_backoff(Duration::from_secs(1), Duration::MAX);
    assert_eq!(policy.backoff(1), Duration::from_secs(1));
    assert_eq!(policy.backoff(2), Duration::from_secs(2));
    assert_eq!(policy.backoff(u32::MAX), Duration::from_secs(1 << 31));
}

#[tokio::test(start_paused = true)]
async fn an_error_whose_display_or_drop_panics_does_not_end_the_restart_loop() {
    // Each run fails with an error whose `Display` panics (the failure log), then with one
    // whose `Drop` panics (dropped before the next run): the loop keeps restarting, then
    // escalates and cancels the supervisor's token.
    #[derive(Debug)]
    enum Hostile {
        Display(taskweave_testkit::PanicOnDisplay),
        Drop(taskweave_testkit::PanicOnDrop),
    }
    impl std::fmt::Display for Hostile {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                Hostile::Display(inner) => write!(f, "{inner}"),
                Hostile::Drop(inner) => write!(f, "{inner}"),
            }
        }
    }
    let supervisor = Supervisor::new(CancellationToken::new());
    let runs = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&runs);
    let task = supervisor
        .spawn_restarting("hostile", policy(3), move |_token| {
            let run = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if run.is_multiple_of(2) {
                    Err(Hostile::Drop(taskweave_testkit::PanicOnDrop("error")))
                } else {
                    Err(Hostile::Display(taskweave_testkit::PanicOnDisplay))
                }
            }
        })
        .unwrap();
    let outcome = task.await.unwrap();
    assert!(
        matches!(outcome, Err(RestartError::GaveUp { restarts: 3, .. })),
        "{outcome:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    assert!(supervisor.token().is_cancelled(), "escalation ran");
    // The error handed back is the user's to drop; keep the test process alive.
    std::mem::forget(outcome);
}

#[tokio::test(start_paused = true)]
async fn a_backoff_too_long_for_the_clock_waits_for_the_shutdown_without_panicking() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let runs = Arc::new(AtomicU32::new(0));
    let task = supervisor
        .spawn_restarting(
            "never-again",
            RestartPolicy::new(10, Duration::from_secs(60))
                .with_backoff(Duration::MAX, Duration::MAX),
            {
                let runs = Arc::clone(&runs);
                move |_token| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    async { Err("unavailable") }
                }
            },
        )
        .unwrap();
    tokio::time::advance(Duration::from_secs(3600 * 24 * 365)).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the backoff never ends by itself"
    );
    let report = supervisor.shutdown(Duration::from_secs(1)).await;
    assert_eq!(report.failed, ["never-again"]);
    assert!(matches!(
        task.await.unwrap(),
        Err(RestartError::Cancelled { .. })
    ));
}
