//! Stopping: close drains, close_within hands back, the token stops intake, nothing leaks.

use std::time::Duration;

use taskweave_pool::{SubmitError, WorkerPool};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::support::{alive_tasks, assert_books_balance, assert_no_leaked_tasks};

const MS: Duration = Duration::from_millis(1);

/// A pool whose jobs take `job` milliseconds and honour their token.
fn sleepy_pool(token: CancellationToken, workers: usize) -> WorkerPool<u64, u64, String> {
    WorkerPool::new(token, workers, 100, |token, job: u64| async move {
        tokio::select! {
            () = token.cancelled() => Err(format!("job {job} interrupted")),
            () = tokio::time::sleep(Duration::from_millis(job)) => Ok(job),
        }
    })
}

#[tokio::test(start_paused = true)]
async fn close_lets_queued_jobs_finish_and_waits_for_every_worker() {
    let baseline = alive_tasks();
    let pool = sleepy_pool(CancellationToken::new(), 2);
    for job in [30, 30, 30, 30, 30] {
        pool.try_submit(job).unwrap();
    }
    let started = Instant::now();
    let report = pool.close().await;
    assert_eq!(started.elapsed(), 90 * MS, "5 jobs of 30 ms on 2 workers");
    assert_eq!(report.metrics.completed, 5);
    assert!(report.handed_back.is_empty());
    assert!(!report.deadline_expired);
    assert_eq!(report.metrics.workers_alive, 0);
    assert!(pool.is_closed());
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn close_is_idempotent_and_concurrent_calls_all_wait() {
    let pool = sleepy_pool(CancellationToken::new(), 1);
    pool.try_submit(50).unwrap();
    let (first, second) = tokio::join!(pool.close(), pool.close());
    assert_eq!(first.metrics.completed, 1);
    assert_eq!(second.metrics.completed, 1);
    let third = pool.close().await;
    assert_eq!(third.metrics.workers_alive, 0);
}

#[tokio::test(start_paused = true)]
async fn close_within_hands_back_unstarted_jobs_and_counts_the_interrupted() {
    let baseline = alive_tasks();
    let pool = sleepy_pool(CancellationToken::new(), 2);
    for job in [100, 100, 100, 100, 100, 100] {
        pool.try_submit(job).unwrap();
    }
    let started = Instant::now();
    let report = pool.close_within(150 * MS).await;
    assert_eq!(started.elapsed(), 150 * MS);
    assert!(report.deadline_expired);
    assert_eq!(report.metrics.completed, 2);
    assert_eq!(report.interrupted, 2);
    assert_eq!(
        report.metrics.failed, 2,
        "the interrupted handlers returned their error"
    );
    let handed_back: Vec<u64> = report.handed_back.iter().map(|(index, _)| *index).collect();
    assert_eq!(handed_back, [4, 5]);
    assert_eq!(report.metrics.handed_back, 2);
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn close_within_that_drains_in_time_reports_no_expiry() {
    let pool = sleepy_pool(CancellationToken::new(), 2);
    pool.try_submit(10).unwrap();
    let report = pool.close_within(Duration::from_secs(1)).await;
    assert!(!report.deadline_expired);
    assert_eq!((report.metrics.completed, report.interrupted), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn close_within_of_an_idle_pool_returns_at_once() {
    let pool = sleepy_pool(CancellationToken::new(), 4);
    let started = Instant::now();
    let report = pool.close_within(Duration::from_secs(1)).await;
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(!report.deadline_expired);
    assert_eq!(report.metrics.workers_alive, 0);
}

#[tokio::test(start_paused = true)]
async fn close_within_a_deadline_too_far_to_represent_waits_without_one() {
    let pool = sleepy_pool(CancellationToken::new(), 1);
    for job in [3_600_000, 10] {
        pool.try_submit(job).unwrap();
    }
    let started = Instant::now();
    let report = pool.close_within(Duration::MAX).await;
    assert_eq!(started.elapsed(), Duration::from_millis(3_600_010));
    assert!(!report.deadline_expired);
    assert_eq!(report.metrics.completed, 2);
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_token_stops_intake_and_queued_jobs_are_handed_back() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let pool = sleepy_pool(token.clone(), 1);
    for job in [100, 100, 100] {
        pool.try_submit(job).unwrap();
    }
    tokio::time::sleep(50 * MS).await;
    token.cancel();
    tokio::task::yield_now().await;
    let caller = CancellationToken::new();
    assert!(matches!(
        pool.submit(&caller, 1).await,
        Err(SubmitError::Closed(1))
    ));
    let report = pool.close().await;
    assert_eq!(report.metrics.failed, 1, "the running job saw its token");
    assert_eq!(report.handed_back.len(), 2);
    let m = report.metrics;
    assert_books_balance(&m, "after close");
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn dropping_the_last_handle_drains_the_queue_and_ends_the_workers() {
    let baseline = alive_tasks();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let pool = WorkerPool::new(CancellationToken::new(), 2, 10, move |_token, job: u32| {
        let done_tx = done_tx.clone();
        async move {
            tokio::time::sleep(10 * MS).await;
            done_tx.send(job).unwrap();
            Ok::<_, String>(())
        }
    });
    for job in 0..4 {
        pool.try_submit(job).unwrap();
    }
    let clone = pool.clone();
    drop(pool);
    assert!(!clone.is_closed(), "a clone keeps the pool open");
    drop(clone);
    let mut done = Vec::new();
    while let Some(job) = done_rx.recv().await {
        done.push(job);
    }
    done.sort_unstable();
    assert_eq!(done, [0, 1, 2, 3], "every accepted job ran");
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn after_a_cancellation_the_metrics_still_account_for_every_job() {
    let token = CancellationToken::new();
    let pool = sleepy_pool(token.clone(), 2);
    for job in [100, 100, 100, 100, 100] {
        pool.try_submit(job).unwrap();
    }
    tokio::time::sleep(10 * MS).await;
    token.cancel();
    // Let the workers see it and stop; no close yet.
    while pool.metrics().workers_alive > 0 {
        tokio::task::yield_now().await;
    }
    let m = pool.metrics();
    assert_eq!(m.failed, 2, "the two running jobs saw their token");
    assert_eq!(m.queued, 3, "the rest wait to be handed back");
    assert_eq!(
        m.submitted,
        m.completed + m.failed + m.panicked + m.dropped + m.queued
    );
    assert_eq!(pool.close().await.handed_back.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_pool_after_a_cancellation_drops_leftovers_through_the_callback() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let dropped = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = std::sync::Arc::clone(&dropped);
    let pool = WorkerPool::builder(1, 10)
        .on_dropped(move |index, _job: u64| sink.lock().unwrap().push(index))
        .spawn(token.clone(), |context, job: u64| async move {
            tokio::select! {
                () = context.cancelled() => Err(format!("job {job} interrupted")),
                () = tokio::time::sleep(Duration::from_millis(job)) => Ok(job),
            }
        });
    for job in [100, 100, 100] {
        pool.try_submit(job).unwrap();
    }
    tokio::time::sleep(10 * MS).await;
    token.cancel();
    drop(pool);
    assert_no_leaked_tasks(baseline).await;
    let mut indices = dropped.lock().unwrap().clone();
    indices.sort_unstable();
    assert_eq!(indices, [1, 2], "never silently lost");
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "deadline must be greater than zero")]
async fn zero_deadline_is_a_programmer_error() {
    let pool = sleepy_pool(CancellationToken::new(), 1);
    let _ = pool.close_within(Duration::ZERO).await;
}
