//! `resume_at`: a full queue takes no job until the workers have drained it that far.

use std::time::Duration;

use taskweave_pool::{Overflow, SubmitError, TrySubmitError, WorkerPool};
use tokio_util::sync::CancellationToken;

use crate::support::{Gate, assert_books_balance};

const MS: Duration = Duration::from_millis(1);

/// One worker that waits at `gate` before each job, a queue of four that resumes at one.
fn gated_pool(gate: &Gate, overflow: Overflow) -> WorkerPool<u32, u32, String> {
    let gate = gate.clone();
    WorkerPool::builder(1, 4)
        .overflow(overflow)
        .resume_at(1)
        .results(16)
        .spawn(CancellationToken::new(), move |_context, job: u32| {
            let gate = gate.clone();
            async move {
                gate.pass().await;
                Ok(job)
            }
        })
}

/// Job 0 taken by the worker (waiting at the gate), jobs 1–4 filling the queue.
async fn fill(pool: &WorkerPool<u32, u32, String>) {
    pool.try_submit(0).unwrap();
    tokio::time::sleep(MS).await;
    for job in 1..=4 {
        pool.try_submit(job).unwrap();
    }
    assert_eq!(pool.len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_blocked_submit_resumes_only_once_the_queue_has_drained_to_resume_at() {
    let gate = Gate::closed();
    let pool = gated_pool(&gate, Overflow::Block);
    let mut results = pool.results().unwrap();
    fill(&pool).await;
    let submitter = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.submit(&CancellationToken::new(), 5).await })
    };
    for left in [3, 2] {
        gate.open(1);
        tokio::time::sleep(MS).await;
        assert_eq!(pool.len(), left);
        assert!(!submitter.is_finished(), "{left} queued: above resume_at");
        assert!(
            matches!(pool.try_submit(9), Err(TrySubmitError::Full(9))),
            "{left} queued: a newcomer does not overtake the waiting submitter"
        );
    }
    gate.open(1);
    assert_eq!(
        submitter.await.unwrap().unwrap(),
        5,
        "drained to one: resumed"
    );
    assert_eq!(pool.len(), 2);
    pool.try_submit(6).unwrap();
    pool.try_submit(7).unwrap();
    assert!(matches!(pool.try_submit(8), Err(TrySubmitError::Full(8))));
    gate.open(8);
    let report = pool.close().await;
    let mut done = Vec::new();
    while let Some(outcome) = futures::StreamExt::next(&mut results).await {
        done.push(outcome.1.unwrap());
    }
    assert_eq!(done, [0, 1, 2, 3, 4, 5, 6, 7], "first in, first out");
    let m = report.metrics;
    assert_eq!((m.completed, m.rejected), (8, 3));
    assert_books_balance(&m, "after close");
}

#[tokio::test(start_paused = true)]
async fn the_reject_policy_refuses_until_the_queue_has_drained_to_resume_at() {
    let gate = Gate::closed();
    let pool = gated_pool(&gate, Overflow::Reject);
    fill(&pool).await;
    let token = CancellationToken::new();
    gate.open(2);
    tokio::time::sleep(MS).await;
    assert_eq!(pool.len(), 2);
    assert!(matches!(
        pool.submit(&token, 5).await,
        Err(SubmitError::Full(5))
    ));
    gate.open(1);
    tokio::time::sleep(MS).await;
    assert_eq!(pool.submit(&token, 5).await.unwrap(), 6);
    gate.open(8);
    let m = pool.close().await.metrics;
    assert_eq!((m.completed, m.rejected), (6, 1));
    assert_books_balance(&m, "after close");
}

/// The documented promise under drop-oldest: a free slot takes the job (nothing is
/// refused or dropped while the queue drains), a full queue drops its oldest.
#[tokio::test(start_paused = true)]
async fn drop_oldest_ignores_resume_at() {
    let gate = Gate::closed();
    let pool = gated_pool(&gate, Overflow::DropOldest);
    fill(&pool).await;
    gate.open(1);
    tokio::time::sleep(MS).await;
    assert_eq!(pool.len(), 3);
    pool.try_submit(5).unwrap();
    assert_eq!(pool.metrics().dropped, 0, "a free slot takes the job");
    pool.try_submit(6).unwrap();
    assert_eq!(pool.metrics().dropped, 1, "full: the oldest goes");
    gate.open(8);
    let m = pool.close().await.metrics;
    assert_eq!((m.completed, m.dropped), (6, 1));
    assert_books_balance(&m, "after close");
}

#[test]
#[should_panic(expected = "resume_at(4) must be below the queue capacity (4)")]
fn resume_at_the_capacity_panics() {
    let _ = WorkerPool::builder::<u32>(1, 4).resume_at(4);
}

/// A pool of one worker, a queue of eight and a results stream of two.
fn pool_with_results(resume_at: usize) -> WorkerPool<u32, u32, String> {
    WorkerPool::builder(1, 8)
        .resume_at(resume_at)
        .results(2)
        .spawn(CancellationToken::new(), |_context, job: u32| async move {
            tokio::task::yield_now().await;
            Ok::<_, String>(job)
        })
}

/// One task submits 40 jobs and reads whatever results are ready between its submits;
/// `None` if it is still stuck after a minute.
async fn submit_and_read_on_one_task(resume_at: usize) -> Option<usize> {
    let pool = pool_with_results(resume_at);
    let mut stream = pool.results().unwrap();
    let token = CancellationToken::new();
    let mut read = 0;
    let work = async {
        for job in 0..40 {
            pool.submit(&token, job).await.unwrap();
            while let Some(Some(_)) =
                futures::FutureExt::now_or_never(futures::StreamExt::next(&mut stream))
            {
                read += 1;
            }
        }
    };
    let finished = tokio::time::timeout(Duration::from_secs(60), work)
        .await
        .is_ok();
    finished.then_some(read)
}

#[tokio::test(start_paused = true)]
async fn a_task_that_submits_and_reads_the_results_can_wait_for_ever_with_resume_at() {
    // What `resume_at`'s docs warn about. Without it, one job taken wakes the submitter,
    // which then reads; with it, the worker stops on the full stream long before the
    // queue has drained to four.
    assert!(submit_and_read_on_one_task(7).await.is_some());
    assert_eq!(submit_and_read_on_one_task(4).await, None);
}

#[tokio::test(start_paused = true)]
async fn results_read_on_another_task_flow_with_any_resume_at() {
    for resume_at in [0, 4, 7] {
        let pool = pool_with_results(resume_at);
        let reader = tokio::spawn(futures::StreamExt::collect::<Vec<_>>(
            pool.results().unwrap(),
        ));
        let token = CancellationToken::new();
        for job in 0..40 {
            pool.submit(&token, job).await.unwrap();
        }
        let report = pool.close().await;
        assert_eq!(report.metrics.completed, 40, "resume_at({resume_at})");
        let jobs: Vec<u32> = reader
            .await
            .unwrap()
            .into_iter()
            .map(|(_, outcome)| outcome.unwrap())
            .collect();
        assert_eq!(jobs, (0..40).collect::<Vec<_>>(), "resume_at({resume_at})");
    }
}
