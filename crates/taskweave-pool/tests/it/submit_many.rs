//! Batches: `submit_many`, `try_submit_many`, and workers that take several jobs at once
//! (`take_per_worker`): what is accepted, what is handed back, and the books in every case.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskweave_pool::{Overflow, Refusal, WorkerPool};
use tokio_util::sync::CancellationToken;

use crate::support::{Gate, assert_books_balance};

const MS: Duration = Duration::from_millis(1);

/// One worker that waits at `gate` before each job, and a queue of `capacity`.
fn gated_pool(gate: &Gate, capacity: usize, overflow: Overflow) -> WorkerPool<u32, u32, String> {
    let gate = gate.clone();
    WorkerPool::builder(1, capacity).overflow(overflow).spawn(
        CancellationToken::new(),
        move |_context, job: u32| {
            let gate = gate.clone();
            async move {
                gate.pass().await;
                Ok(job)
            }
        },
    )
}

#[tokio::test(start_paused = true)]
async fn try_submit_many_queues_what_fits_and_hands_back_the_rest_in_order() {
    let gate = Gate::closed();
    let pool = gated_pool(&gate, 3, Overflow::Block);
    let refused = pool.try_submit_many([10, 11, 12, 13, 14]).unwrap_err();
    assert_eq!(refused.accepted, 0..3);
    assert_eq!(refused.refused, [13, 14]);
    assert_eq!(refused.reason, Refusal::Full);
    assert_eq!(refused.to_string(), "2 of 5 jobs not accepted: queue full");
    let m = pool.metrics();
    assert_eq!((m.submitted, m.rejected, m.queued), (3, 2, 3));
    // The next batch's indices follow, gaps included (like refused single submissions).
    assert_eq!(pool.try_submit_many([]).unwrap(), 5..5);
    gate.open(3);
    let report = pool.close().await;
    assert_eq!(report.metrics.completed, 3);
    assert_books_balance(&report.metrics, "after close");
    let closed = pool.try_submit_many([1, 2]).unwrap_err();
    assert_eq!(
        (closed.accepted.clone(), closed.reason),
        (5..5, Refusal::Closed)
    );
    assert_eq!(closed.into_refused(), [1, 2]);
}

#[tokio::test(start_paused = true)]
async fn submit_many_waits_for_room_and_accepts_the_whole_batch() {
    let gate = Gate::closed();
    let pool = gated_pool(&gate, 2, Overflow::Block);
    let token = CancellationToken::new();
    let submitter = {
        let pool = pool.clone();
        let token = token.clone();
        tokio::spawn(async move { pool.submit_many(&token, 0..7).await })
    };
    tokio::time::sleep(MS).await;
    assert!(
        !submitter.is_finished(),
        "the queue is full: the batch waits"
    );
    gate.open(7);
    assert_eq!(submitter.await.unwrap().unwrap(), 0..7);
    let report = pool.close().await;
    assert_eq!(report.metrics.completed, 7);
    assert_books_balance(&report.metrics, "after close");
}

#[tokio::test(start_paused = true)]
async fn submit_many_with_the_reject_policy_refuses_the_rest_when_full() {
    let gate = Gate::closed();
    let pool = gated_pool(&gate, 2, Overflow::Reject);
    let token = CancellationToken::new();
    let refused = pool.submit_many(&token, [1, 2, 3, 4]).await.unwrap_err();
    assert_eq!(
        (refused.accepted.clone(), refused.reason),
        (0..2, Refusal::Full)
    );
    assert_eq!(refused.refused, [3, 4]);
    gate.open(2);
    let m = pool.close().await.metrics;
    assert_eq!((m.submitted, m.completed, m.rejected), (2, 2, 2));
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_token_refuses_the_batch_and_one_cancelled_mid_wait_hands_back_the_rest() {
    let gate = Gate::closed();
    let pool = gated_pool(&gate, 2, Overflow::Block);
    let token = CancellationToken::new();
    let cancelled = token.child_token();
    cancelled.cancel();
    // Observed before the batch: nothing is taken, even with room in the queue.
    let refused = pool.submit_many(&cancelled, [1, 2]).await.unwrap_err();
    assert_eq!(
        (refused.accepted.clone(), refused.reason),
        (0..0, Refusal::Cancelled)
    );
    assert_eq!(refused.refused, [1, 2]);

    let request = token.child_token();
    let canceller = request.clone();
    tokio::spawn(async move {
        tokio::time::sleep(5 * MS).await;
        canceller.cancel();
    });
    // The worker takes one job (and waits at the gate), two fill the queue, two wait.
    let refused = pool
        .submit_many(&request, [10, 11, 12, 13, 14])
        .await
        .unwrap_err();
    assert_eq!(refused.reason, Refusal::Cancelled);
    assert_eq!(refused.accepted, 2..5);
    assert_eq!(refused.refused, [13, 14]);
    let m = pool.metrics();
    assert_eq!((m.submitted, m.rejected), (3, 0), "cancelled, not rejected");
    gate.open(3);
    let m = pool.close().await.metrics;
    assert_eq!(m.completed, 3);
    assert_books_balance(&m, "after close");
}

#[tokio::test(start_paused = true)]
async fn a_submit_many_dropped_mid_wait_keeps_what_it_queued_and_counts_the_rest_refused() {
    let gate = Gate::closed();
    let pool = gated_pool(&gate, 2, Overflow::Block);
    let token = CancellationToken::new();
    let outcome = tokio::time::timeout(5 * MS, pool.submit_many(&token, [1, 2, 3, 4, 5, 6])).await;
    assert!(outcome.is_err(), "given up while waiting for room");
    let m = pool.metrics();
    assert_eq!(m.submitted, 3, "one taken by the worker, two queued: {m:?}");
    gate.open(3);
    let m = pool.close().await.metrics;
    assert_eq!(m.completed, 3);
    assert_books_balance(&m, "after close");
}

#[tokio::test(start_paused = true)]
async fn submit_many_on_a_closed_pool_hands_back_everything() {
    let gate = Gate::closed();
    let pool = gated_pool(&gate, 2, Overflow::Block);
    drop(pool.close().await);
    let token = CancellationToken::new();
    let refused = pool.submit_many(&token, [7, 8]).await.unwrap_err();
    assert_eq!(
        (refused.accepted.clone(), refused.reason),
        (0..0, Refusal::Closed)
    );
    assert_eq!(refused.refused, [7, 8]);
    assert_eq!(pool.metrics().rejected, 2);
}

#[tokio::test(start_paused = true)]
async fn drop_oldest_with_a_batch_larger_than_the_queue_drops_the_batchs_own_first_jobs() {
    let gate = Gate::closed();
    let dropped = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&dropped);
    let pool = {
        let gate = gate.clone();
        WorkerPool::builder(1, 3)
            .overflow(Overflow::DropOldest)
            .on_dropped(move |index, job: u32| seen.lock().unwrap().push((index, job)))
            .spawn(CancellationToken::new(), move |_context, job: u32| {
                let gate = gate.clone();
                async move {
                    gate.pass().await;
                    Ok::<_, String>(job)
                }
            })
    };
    // No worker has run yet: the whole batch goes in, the oldest two come out.
    assert_eq!(pool.try_submit_many([10, 11, 12, 13, 14]).unwrap(), 0..5);
    assert_eq!(*dropped.lock().unwrap(), [(0, 10), (1, 11)]);
    // And a batch evicts what was queued before it, oldest first.
    let token = CancellationToken::new();
    assert_eq!(pool.submit_many(&token, [20]).await.unwrap(), 5..6);
    assert_eq!(dropped.lock().unwrap()[2], (2, 12));
    gate.open(3);
    let m = pool.close().await.metrics;
    assert_eq!((m.submitted, m.completed, m.dropped), (6, 3, 3));
    assert_books_balance(&m, "after close");
}

/// One worker taking up to four jobs at a time, each job sleeping its value in ms (or
/// returning early when the token is cancelled), a panic for 13.
fn taking_pool(take: usize) -> WorkerPool<u64, u64, String> {
    WorkerPool::builder(1, 16).take_per_worker(take).spawn(
        CancellationToken::new(),
        |context, job: u64| async move {
            assert_ne!(job, 13, "planned panic");
            tokio::select! {
                () = context.cancelled() => Err(format!("job {job} interrupted")),
                () = tokio::time::sleep(Duration::from_millis(job)) => Ok(job),
            }
        },
    )
}

#[tokio::test(start_paused = true)]
async fn a_deadline_close_hands_back_the_jobs_a_worker_took_but_had_not_started() {
    let pool = taking_pool(4);
    pool.try_submit_many([100; 6]).unwrap();
    tokio::time::sleep(MS).await;
    // Job 0 runs; the worker holds 1, 2, 3; 4 and 5 are in the queue: all five are queued.
    let m = pool.metrics();
    assert_eq!((m.in_flight, m.queued), (1, 5), "{m:?}");
    assert_eq!(pool.len(), 2, "three of them held by the worker");
    let report = pool.close_within(150 * MS).await;
    assert!(report.deadline_expired);
    assert_eq!((report.metrics.completed, report.interrupted), (1, 1));
    let handed_back: Vec<u64> = report.handed_back.iter().map(|(index, _)| *index).collect();
    assert_eq!(handed_back, [2, 3, 4, 5]);
    assert_eq!(report.metrics.queued, 0);
    assert_books_balance(&report.metrics, "after the deadline");
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_the_middle_of_a_taken_batch_loses_none_of_the_rest() {
    let pool = WorkerPool::builder(1, 16)
        .take_per_worker(4)
        .results(16)
        .spawn(CancellationToken::new(), |_context, job: u64| async move {
            assert_ne!(job, 13, "planned panic");
            Ok::<_, String>(job)
        });
    let mut results = pool.results().unwrap();
    pool.try_submit_many([11, 12, 13, 14, 15]).unwrap();
    let (report, outcomes) = tokio::join!(pool.close(), async {
        let mut outcomes = Vec::new();
        while let Some((index, outcome)) = futures::StreamExt::next(&mut results).await {
            outcomes.push((index, outcome.is_ok()));
        }
        outcomes
    });
    assert_eq!(
        outcomes,
        [(0, true), (1, true), (2, false), (3, true), (4, true)],
        "in order, one worker"
    );
    let m = report.metrics;
    assert_eq!((m.completed, m.panicked), (4, 1));
    assert_books_balance(&m, "after close");
}

#[test]
fn jobs_a_worker_held_when_its_runtime_shut_down_are_handed_back() {
    // Current-thread: the batch is queued before the worker's first poll, so the worker
    // takes its share (three) at once.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pool = runtime.block_on(async {
        let pool = WorkerPool::builder(1, 8)
            .take_per_worker(3)
            .spawn(CancellationToken::new(), |_context, _job: u32| {
                std::future::pending::<Result<(), String>>()
            });
        pool.try_submit_many(0..5).unwrap();
        while pool.in_flight() < 1 {
            tokio::task::yield_now().await;
        }
        pool
    });
    // The worker runs job 0 and holds 1 and 2; 3 and 4 are queued.
    assert_eq!((pool.metrics().queued, pool.len()), (4, 2));
    drop(runtime);
    let other = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let report = other.block_on(pool.close());
    let m = report.metrics;
    assert_eq!((m.submitted, m.abandoned), (5, 1));
    let handed_back: Vec<u64> = report.handed_back.iter().map(|(index, _)| *index).collect();
    assert_eq!(handed_back, [1, 2, 3, 4]);
    assert_eq!((m.in_flight, m.workers_alive, m.queued), (0, 0, 0));
    assert_books_balance(&m, "after the runtime shut down");
}

#[test]
#[should_panic(expected = "take_per_worker must be at least one")]
fn taking_zero_jobs_at_a_time_is_a_programmer_error() {
    let _ = WorkerPool::builder::<u32>(1, 1).take_per_worker(0);
}

#[tokio::test(start_paused = true)]
async fn the_pools_own_token_cancelled_mid_wait_is_a_cancellation_as_with_submit() {
    let gate = Gate::closed();
    let token = CancellationToken::new();
    let pool = {
        let gate = gate.clone();
        WorkerPool::builder(1, 1).spawn(token.clone(), move |_context, job: u32| {
            let gate = gate.clone();
            async move {
                gate.pass().await;
                Ok::<_, String>(job)
            }
        })
    };
    let canceller = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(5 * MS).await;
        canceller.cancel();
    });
    let refused = pool.submit_many(&token, [1, 2, 3, 4]).await.unwrap_err();
    assert_eq!(refused.reason, Refusal::Cancelled);
    assert_eq!(
        refused.accepted,
        0..2,
        "one taken by the worker, one queued"
    );
    assert_eq!(refused.refused, [3, 4]);
    assert_eq!(pool.metrics().rejected, 0, "cancelled, not rejected");
    gate.open(2);
    let report = pool.close().await;
    assert_books_balance(&report.metrics, "after close");
}

// Held jobs have left the queue: with `take_per_worker(max)` the pool may accept up to
// `workers × (max − 1)` jobs beyond its capacity, as documented, and no more.
#[tokio::test(start_paused = true)]
async fn held_jobs_let_the_pool_accept_at_most_workers_times_max_minus_one_beyond_capacity() {
    let gate = Gate::closed();
    let pool = {
        let gate = gate.clone();
        WorkerPool::builder(2, 8).take_per_worker(4).spawn(
            CancellationToken::new(),
            move |_context, job: u32| {
                let gate = gate.clone();
                async move {
                    gate.pass().await;
                    Ok::<_, String>(job)
                }
            },
        )
    };
    for _ in 0..4 {
        // Fill the queue, then let the workers take their shares.
        let _ = pool.try_submit_many(0..100);
        tokio::time::sleep(MS).await;
    }
    let m = pool.metrics();
    assert_eq!(m.in_flight, 2);
    assert_eq!(pool.len(), 8, "the queue is full");
    // The first worker took half of eight (it runs one, holds three), the second half of
    // the four left (runs one, holds one); then the queue filled again.
    assert_eq!(m.queued, 8 + 3 + 1, "{m:?}");
    assert!(m.queued <= 8 + 2 * 3, "the documented bound");
    gate.open(100);
    let report = pool.close().await;
    assert_books_balance(&report.metrics, "after close");
}
