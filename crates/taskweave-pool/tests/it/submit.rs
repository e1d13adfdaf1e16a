//! Submitting: backpressure, refusal, drop-oldest, and the job always handed back.

use std::sync::{Arc, Mutex};

use taskweave_pool::{Overflow, SubmitError, TrySubmitError, WorkerPool};
use tokio_test::{assert_pending, assert_ready};
use tokio_util::sync::CancellationToken;

use crate::support::{Gate, assert_books_balance};

/// A pool of one worker and a queue of one, whose handler waits at `gate`.
fn gated_pool(overflow: Overflow, gate: &Gate) -> WorkerPool<u32, u32, String> {
    gated_pool_on(CancellationToken::new(), overflow, gate)
}

/// [`gated_pool`] started with `token`.
fn gated_pool_on(
    token: CancellationToken,
    overflow: Overflow,
    gate: &Gate,
) -> WorkerPool<u32, u32, String> {
    let gate = gate.clone();
    WorkerPool::builder(1, 1)
        .overflow(overflow)
        .spawn(token, move |_token, job: u32| {
            let gate = gate.clone();
            async move {
                gate.pass().await;
                Ok(job)
            }
        })
}

/// Lets the worker take the first job, so the queue is empty and the worker busy.
async fn occupy_worker(pool: &WorkerPool<u32, u32, String>) {
    pool.try_submit(0).unwrap();
    while pool.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
}

/// The token a blocked `submit` waits on: one the pool does not know (watched beside the
/// wait), the one the pool was started with, or the pool's own child of it (both of which
/// close the queue when cancelled, so the wait is the channel's alone).
#[derive(Clone, Copy, Debug)]
enum Caller {
    Unrelated,
    Given,
    Pools,
}

const CALLERS: [Caller; 3] = [Caller::Unrelated, Caller::Given, Caller::Pools];

/// A gated pool whose worker is busy with job 0 and whose queue holds job 1, and the token
/// of `which`.
async fn full_pool_for(
    gate: &Gate,
    which: Caller,
) -> (WorkerPool<u32, u32, String>, CancellationToken) {
    let given = CancellationToken::new();
    let pool = gated_pool_on(given.clone(), Overflow::Block, gate);
    occupy_worker(&pool).await;
    pool.try_submit(1).unwrap();
    assert_eq!(pool.len(), 1);
    let token = match which {
        Caller::Unrelated => CancellationToken::new(),
        Caller::Given => given,
        Caller::Pools => pool.token(),
    };
    (pool, token)
}

#[tokio::test]
async fn full_queue_blocks_submit_until_a_worker_frees_a_slot() {
    for which in CALLERS {
        let gate = Gate::closed();
        let (pool, token) = full_pool_for(&gate, which).await;
        let mut submit = tokio_test::task::spawn(pool.submit(&token, 2));
        assert_pending!(submit.poll(), "{which:?}");
        assert_pending!(submit.poll(), "{which:?}: still full, the worker is busy");

        gate.open(1); // job 0 ends; the worker takes job 1 and frees the slot
        while pool.len() == 1 {
            tokio::task::yield_now().await;
        }
        assert!(
            submit.is_woken(),
            "{which:?}: freeing a slot wakes the blocked submitter"
        );
        assert_eq!(assert_ready!(submit.poll()), Ok(2), "{which:?}");
        drop(submit);

        gate.open(2);
        let m = pool.close().await.metrics;
        assert_eq!((m.submitted, m.completed), (3, 3), "{which:?}");
    }
}

#[tokio::test]
async fn closing_the_pool_wakes_a_blocked_submitter_with_closed() {
    for which in CALLERS {
        let gate = Gate::closed();
        let (pool, token) = full_pool_for(&gate, which).await;
        let mut submit = tokio_test::task::spawn(pool.submit(&token, 2));
        assert_pending!(submit.poll(), "{which:?}");
        let closer = pool.clone();
        let mut close = tokio_test::task::spawn(async move { closer.close().await });
        assert_pending!(close.poll(), "{which:?}");
        assert!(submit.is_woken(), "{which:?}");
        assert_eq!(
            assert_ready!(submit.poll()),
            Err(SubmitError::Closed(2)),
            "{which:?}"
        );
        gate.open(2);
        let m = close.await.metrics;
        assert_eq!(
            (m.submitted, m.completed, m.rejected),
            (2, 2, 1),
            "{which:?}"
        );
    }
}

#[tokio::test]
async fn a_submit_dropped_while_waiting_is_counted_as_refused() {
    for which in CALLERS {
        let gate = Gate::closed();
        let (pool, token) = full_pool_for(&gate, which).await;
        let mut submit = tokio_test::task::spawn(pool.submit(&token, 2));
        assert_pending!(submit.poll(), "{which:?}");
        drop(submit); // a caller's timeout gave up on it: job 2 was never accepted
        gate.open(2);
        let m = pool.close().await.metrics;
        assert_eq!((m.submitted, m.completed), (2, 2), "{which:?}");
        assert_books_balance(&m, &format!("{which:?}"));
    }
}

#[tokio::test]
async fn cancelling_the_callers_token_hands_the_job_back() {
    let gate = Gate::closed();
    let (pool, token) = full_pool_for(&gate, Caller::Unrelated).await;
    let mut submit = tokio_test::task::spawn(pool.submit(&token, 2));
    assert_pending!(submit.poll());
    token.cancel();
    assert!(submit.is_woken());
    assert_eq!(assert_ready!(submit.poll()), Err(SubmitError::Cancelled(2)));
    drop(submit);
    gate.open(2);
    assert_eq!(pool.close().await.metrics.submitted, 2);
}

#[tokio::test]
async fn cancelling_the_pools_token_wakes_a_blocked_submitter_with_closed() {
    let gate = Gate::closed();
    let parent = CancellationToken::new();
    let pool = WorkerPool::builder(1, 1).spawn(parent.clone(), {
        let gate = gate.clone();
        move |_token, job: u32| {
            let gate = gate.clone();
            async move {
                gate.pass().await;
                Ok::<_, String>(job)
            }
        }
    });
    pool.try_submit(0).unwrap();
    while pool.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    pool.try_submit(1).unwrap();
    let caller = CancellationToken::new();
    let mut submit = tokio_test::task::spawn(pool.submit(&caller, 2));
    assert_pending!(submit.poll());
    parent.cancel();
    assert!(
        submit.is_woken(),
        "the cancellation closes the queue and wakes the submitter"
    );
    assert_eq!(assert_ready!(submit.poll()), Err(SubmitError::Closed(2)));
    drop(submit);
    gate.open(1);
    let report = pool.close().await;
    assert_eq!(report.handed_back.len(), 1, "job 1 never started");
    let m = report.metrics;
    assert_books_balance(&m, "after close");
}

#[tokio::test]
async fn cancelling_the_pools_own_token_hands_a_waiting_submit_its_job_as_cancelled() {
    for which in [Caller::Given, Caller::Pools] {
        let gate = Gate::closed();
        let (pool, token) = full_pool_for(&gate, which).await;
        let mut submit = tokio_test::task::spawn(pool.submit(&token, 2));
        assert_pending!(submit.poll(), "{which:?}");
        token.cancel();
        assert!(
            submit.is_woken(),
            "{which:?}: the cancellation closes the queue, which wakes the send"
        );
        assert_eq!(
            assert_ready!(submit.poll()),
            Err(SubmitError::Cancelled(2)),
            "{which:?}"
        );
        drop(submit);
        gate.open(1);
        let report = pool.close().await;
        assert_eq!(report.handed_back, vec![(1, 1)], "{which:?}: never started");
        let m = report.metrics;
        assert_eq!((m.submitted, m.rejected), (2, 0), "{which:?}");
        assert_books_balance(&m, &format!("{which:?}"));
    }
}

#[tokio::test]
async fn cancelling_an_ancestor_of_the_pools_token_hands_a_waiting_submit_its_job_as_cancelled() {
    let gate = Gate::closed();
    let root = CancellationToken::new();
    let given = root.child_token();
    let pool = gated_pool_on(given.clone(), Overflow::Block, &gate);
    occupy_worker(&pool).await;
    pool.try_submit(1).unwrap();
    let mut submit = tokio_test::task::spawn(pool.submit(&given, 2));
    assert_pending!(submit.poll());
    root.cancel();
    assert!(
        submit.is_woken(),
        "the cancellation reaches the pool's hook"
    );
    assert_eq!(assert_ready!(submit.poll()), Err(SubmitError::Cancelled(2)));
    drop(submit);
    gate.open(1);
    let report = pool.close().await;
    assert_eq!(report.handed_back, vec![(1, 1)]);
    assert_eq!(report.metrics.submitted, 2);
}

#[tokio::test]
async fn reject_policy_refuses_a_full_queue_at_once() {
    let gate = Gate::closed();
    let pool = gated_pool(Overflow::Reject, &gate);
    occupy_worker(&pool).await;
    pool.try_submit(1).unwrap();
    let token = CancellationToken::new();
    assert_eq!(pool.submit(&token, 2).await, Err(SubmitError::Full(2)));
    assert_eq!(pool.try_submit(3), Err(TrySubmitError::Full(3)));
    assert_eq!(pool.metrics().rejected, 2);
    gate.open(2);
    pool.close().await;
}

#[tokio::test]
async fn try_submit_never_waits_whatever_the_policy() {
    let gate = Gate::closed();
    let pool = gated_pool(Overflow::Block, &gate);
    occupy_worker(&pool).await;
    pool.try_submit(1).unwrap();
    let error = pool.try_submit(2).unwrap_err();
    assert!(error.is_full());
    assert_eq!(error.into_inner(), 2);
    gate.open(2);
    pool.close().await;
    assert_eq!(pool.try_submit(4), Err(TrySubmitError::Closed(4)));
}

#[tokio::test]
async fn drop_oldest_keeps_the_newest_and_hands_the_dropped_to_the_callback() {
    let gate = Gate::closed();
    let dropped = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&dropped);
    let pool = WorkerPool::builder(1, 2)
        .overflow(Overflow::DropOldest)
        .on_dropped(move |index, job: u32| sink.lock().unwrap().push((index, job)))
        .spawn(CancellationToken::new(), {
            let gate = gate.clone();
            move |_token, job: u32| {
                let gate = gate.clone();
                async move {
                    gate.pass().await;
                    Ok::<_, String>(job)
                }
            }
        });
    pool.try_submit(100).unwrap();
    while pool.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    let token = CancellationToken::new();
    for job in 101..=105 {
        pool.submit(&token, job).await.unwrap();
    }
    assert_eq!(*dropped.lock().unwrap(), [(1, 101), (2, 102), (3, 103)]);
    gate.open(3);
    let report = pool.close().await;
    let metrics = report.metrics;
    assert_eq!(
        (metrics.submitted, metrics.completed, metrics.dropped),
        (6, 3, 3)
    );
    assert_eq!(metrics.rejected, 0);
}

#[tokio::test]
async fn try_submit_refuses_under_reject_and_evicts_under_drop_oldest() {
    for overflow in [Overflow::Reject, Overflow::DropOldest] {
        let gate = Gate::closed();
        let pool = gated_pool(overflow, &gate);
        occupy_worker(&pool).await;
        pool.try_submit(1).unwrap();
        let second = pool.try_submit(2);
        match overflow {
            Overflow::Reject => assert_eq!(second, Err(TrySubmitError::Full(2))),
            _ => {
                assert_eq!(second, Ok(2));
                assert_eq!(pool.metrics().dropped, 1, "job 1 made room");
            }
        }
        gate.open(2);
        pool.close().await;
    }
}

#[tokio::test]
async fn indices_follow_acceptance_order() {
    let pool = WorkerPool::new(
        CancellationToken::new(),
        2,
        8,
        |_token, job: u32| async move { Ok::<_, String>(job) },
    );
    let token = CancellationToken::new();
    assert_eq!(pool.submit(&token, 1).await.unwrap(), 0);
    assert_eq!(pool.try_submit(2).unwrap(), 1);
    assert_eq!(pool.submit(&token, 3).await.unwrap(), 2);
    pool.close().await;
}

#[tokio::test]
#[should_panic(expected = "workers must be greater than zero")]
async fn zero_workers_is_a_programmer_error() {
    let _ = WorkerPool::new(CancellationToken::new(), 0, 1, |_t, j: u8| async move {
        Ok::<_, String>(j)
    });
}

#[tokio::test]
#[should_panic(expected = "queue capacity must be greater than zero")]
async fn zero_capacity_is_a_programmer_error() {
    let _ = WorkerPool::new(CancellationToken::new(), 1, 0, |_t, j: u8| async move {
        Ok::<_, String>(j)
    });
}

#[test]
#[should_panic(expected = "workers is more than MAX_WORKERS (65536)")]
fn a_worker_count_near_usize_max_is_refused_before_anything_is_allocated() {
    let _ = WorkerPool::builder::<u8>(usize::MAX, 1);
}

#[tokio::test]
async fn max_workers_itself_is_a_working_pool() {
    let pool = WorkerPool::new(
        CancellationToken::new(),
        taskweave_pool::MAX_WORKERS,
        usize::MAX,
        |_t, j: u8| async move { Ok::<_, String>(j) },
    );
    pool.try_submit(1).unwrap();
    let report = pool.close().await;
    assert_eq!(report.metrics.completed, 1);
    assert_eq!(report.metrics.workers_alive, 0);
}

#[test]
#[should_panic(expected = "results capacity must be greater than zero")]
fn zero_results_capacity_is_a_programmer_error() {
    let _ = WorkerPool::builder::<u8>(1, 1).results(0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_blocked_submitters_on_a_small_queue_all_get_through() {
    // Four producers keep an 8-job queue full: every wake-up must reach someone, or a
    // producer would wait forever.
    for _ in 0..5 {
        let pool = WorkerPool::new(
            CancellationToken::new(),
            3,
            8,
            |_ctx, job: u64| async move {
                if job.is_multiple_of(7) {
                    tokio::task::yield_now().await;
                }
                Ok::<_, String>(job)
            },
        );
        let producers: Vec<_> = (0..4)
            .map(|p| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let token = CancellationToken::new();
                    for job in 0..2_000 {
                        pool.submit(&token, p * 10_000 + job).await.unwrap();
                    }
                })
            })
            .collect();
        for producer in producers {
            producer.await.unwrap();
        }
        let report = pool.close().await;
        assert_eq!(report.metrics.submitted, 8_000);
        assert_eq!(report.metrics.completed, 8_000);
    }
}

#[tokio::test]
async fn a_cancelled_token_wins_over_room_in_the_queue() {
    let pool = WorkerPool::new(CancellationToken::new(), 1, 8, |_t, j: u8| async move {
        Ok::<_, String>(j)
    });
    let request = CancellationToken::new();
    request.cancel();
    assert!(matches!(
        pool.submit(&request, 1).await,
        Err(SubmitError::Cancelled(1))
    ));
    let report = pool.close().await;
    assert_eq!((report.metrics.submitted, report.metrics.completed), (0, 0));
}
