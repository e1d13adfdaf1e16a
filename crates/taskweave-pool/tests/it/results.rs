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

/// A consumer woken for the last outcome but not yet polled when the last worker exits: the
/// close of the stream must neither lose that outcome nor leave the consumer waiting.
#[tokio::test(flavor = "current_thread")]
async fn a_consumer_woken_but_not_polled_when_the_workers_exit_gets_the_outcome_then_the_end() {
    let pool = WorkerPool::builder(1, 4)
        .results(4)
        .spawn(CancellationToken::new(), |_context, job: u64| async move {
            Ok::<_, String>(job * 2)
        });
    let mut results = pool.results().unwrap();
    let mut next = tokio_test::task::spawn(results.next());
    tokio_test::assert_pending!(next.poll());
    pool.try_submit(21).unwrap();
    // The worker runs the job, delivers (waking the consumer) and, the queue being closed,
    // exits and closes the stream; the consumer has not run in between.
    let report = pool.close().await;
    assert_eq!(report.metrics.completed, 1);
    assert!(next.is_woken());
    let (index, outcome) = tokio_test::assert_ready!(next.poll()).expect("the outcome");
    assert_eq!((index, outcome.ok()), (0, Some(42)));
    drop(next);
    assert!(results.next().await.is_none(), "then the end");
    assert!(results.is_terminated());
}

/// Worker tasks dropped before they ever ran (their runtime shut down) still run their exit
/// steps: the pool counts no worker alive, refuses jobs, and the results stream ends.
#[test]
fn workers_dropped_before_they_ran_still_close_the_pool_and_end_the_stream() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // Built inside the runtime's context but outside any `block_on`: nothing ever polls the
    // spawned workers.
    let pool = {
        let _context = runtime.enter();
        WorkerPool::builder(2, 4)
            .results(4)
            .spawn(CancellationToken::new(), |_context, job: u64| async move {
                Ok::<_, String>(job)
            })
    };
    let mut results = pool.results().unwrap();
    assert_eq!(pool.metrics().workers_alive, 2);
    drop(runtime);
    assert_eq!(pool.metrics().workers_alive, 0);
    assert!(pool.is_closed());
    let mut next = tokio_test::task::spawn(results.next());
    assert!(tokio_test::assert_ready!(next.poll()).is_none());
}
