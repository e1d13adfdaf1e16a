//! The results stream: completion order, every outcome, ends with the workers.

use std::time::Duration;

use futures::stream::FusedStream;
use futures::{Stream, StreamExt};
use taskweave_pool::{JobError, WorkerPool};
use tokio_util::sync::CancellationToken;

use crate::support::{alive_tasks, assert_no_leaked_tasks};

fn pool_with_results() -> WorkerPool<u64, u64, String> {
    WorkerPool::builder(3, 16).results(4).spawn(
        CancellationToken::new(),
        |_token, job: u64| async move {
            tokio::time::sleep(Duration::from_millis(job)).await;
            match job {
                20 => Err("twenty is unlucky".to_owned()),
                35 => panic!("thirty-five panicked"),
                _ => Ok(job),
            }
        },
    )
}

#[tokio::test(start_paused = true)]
async fn results_arrive_in_completion_order_and_end_after_the_workers() {
    let pool = pool_with_results();
    let mut results = pool.results().unwrap();
    for job in [50, 10, 35, 20, 40] {
        pool.try_submit(job).unwrap();
    }
    let closing = pool.clone();
    let close = tokio::spawn(async move { closing.close().await });
    let mut seen = Vec::new();
    while let Some((index, outcome)) = results.next().await {
        seen.push((
            index,
            outcome.map_err(|error| matches!(error, JobError::Panicked(_))),
        ));
    }
    assert!(results.is_terminated());
    // Workers start 50, 10, 35 at 0 ms; 20 at 10 ms (ends 30); 40 at 30 ms (ends 70).
    assert_eq!(
        seen,
        [
            (1, Ok(10)),
            (3, Err(false)),
            (2, Err(true)),
            (0, Ok(50)),
            (4, Ok(40))
        ]
    );
    let report = close.await.unwrap();
    assert_eq!(report.metrics.completed, 3);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_results_stream_early_does_not_stall_or_leak() {
    let baseline = alive_tasks();
    let pool = pool_with_results();
    let results = pool.results().unwrap();
    for job in 0..12 {
        pool.try_submit(job).unwrap();
    }
    drop(results);
    let report = pool.close().await;
    assert_eq!(report.metrics.completed, 12);
    drop(pool);
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn a_results_stream_never_taken_does_not_block_close() {
    let baseline = alive_tasks();
    let pool = pool_with_results();
    for job in 0..14 {
        pool.try_submit(job).unwrap();
    }
    let report = pool.close().await;
    assert_eq!(
        report.metrics.completed + report.metrics.failed + report.metrics.panicked,
        14
    );
    drop(pool);
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn dropping_the_results_stream_wakes_workers_blocked_on_it() {
    let baseline = alive_tasks();
    let pool = pool_with_results();
    let mut results = pool.results().unwrap();
    for job in 0..12 {
        pool.try_submit(job).unwrap();
    }
    assert!(results.next().await.is_some());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!pool.is_empty(), "workers are blocked on the full stream");
    drop(results);
    let report = pool.close().await;
    assert_eq!(
        report.metrics.completed + report.metrics.failed + report.metrics.panicked,
        12
    );
    drop(pool);
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn close_within_is_not_held_up_by_a_full_results_stream() {
    let pool = pool_with_results();
    let _results = pool.results().unwrap(); // taken, never read
    for job in 0..12 {
        pool.try_submit(job).unwrap();
    }
    let report = pool.close_within(Duration::from_millis(500)).await;
    assert!(report.deadline_expired);
    assert!(!report.handed_back.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_slow_results_consumer_applies_backpressure_to_the_workers() {
    let pool = pool_with_results();
    let mut results = pool.results().unwrap();
    for job in 0..10 {
        pool.try_submit(job).unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // 4 outcomes buffered, 3 workers blocked on sending theirs.
    assert_eq!(results.size_hint().0, 4);
    assert_eq!(pool.metrics().in_flight, 0);
    assert_eq!(pool.len(), 3);
    let mut count = 0;
    let close = tokio::spawn({
        let pool = pool.clone();
        async move { pool.close().await }
    });
    while results.next().await.is_some() {
        count += 1;
    }
    assert_eq!(count, 10);
    close.await.unwrap();
}
