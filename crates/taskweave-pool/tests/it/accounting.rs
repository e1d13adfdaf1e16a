//! The pool's accounting invariant over random outcomes, policies and close points.

use std::time::Duration;

use proptest::prelude::*;
use taskweave_pool::{Overflow, PoolMetrics, WorkerPool};
use tokio_util::sync::CancellationToken;

use crate::support::{alive_tasks, assert_books_balance, assert_no_leaked_tasks};

#[derive(Clone, Copy, Debug)]
enum Outcome {
    Ok,
    Error,
    Panic,
}

#[derive(Clone, Copy, Debug)]
enum Stop {
    Close(u64),
    CloseWithin(u64),
    CancelThenClose(u64),
}

fn outcome() -> impl Strategy<Value = (Outcome, u64)> {
    (
        prop_oneof![
            Just(Outcome::Ok),
            Just(Outcome::Error),
            Just(Outcome::Panic)
        ],
        0_u64..30,
    )
}

fn stop() -> impl Strategy<Value = Stop> {
    prop_oneof![
        (0_u64..200).prop_map(Stop::Close),
        (1_u64..200).prop_map(Stop::CloseWithin),
        (0_u64..200).prop_map(Stop::CancelThenClose),
    ]
}

fn policy() -> impl Strategy<Value = Overflow> {
    prop_oneof![
        Just(Overflow::Block),
        Just(Overflow::Reject),
        Just(Overflow::DropOldest)
    ]
}

#[derive(Clone, Copy, Debug)]
enum Submit {
    /// `submit`, waiting as long as it takes.
    Wait,
    /// `try_submit`.
    Try,
    /// `submit` given up (dropped) after this many milliseconds.
    Timeout(u64),
    /// `submit_many` of this job and the next ones (this many in all), given up (dropped)
    /// after the milliseconds if any.
    Many(usize, Option<u64>),
    /// `try_submit_many` of this job and the next ones (this many in all).
    TryMany(usize),
}

fn submit_mode() -> impl Strategy<Value = Submit> {
    prop_oneof![
        Just(Submit::Wait),
        Just(Submit::Try),
        (0_u64..20).prop_map(Submit::Timeout),
        (1_usize..8, proptest::option::of(0_u64..20)).prop_map(|(n, ms)| Submit::Many(n, ms)),
        (1_usize..8).prop_map(Submit::TryMany),
    ]
}

fn simulate(
    jobs: Vec<((Outcome, u64), Submit)>,
    overflow: Overflow,
    workers: usize,
    capacity: usize,
    take: usize,
    stop: Stop,
) -> (PoolMetrics, usize, u64) {
    let runtime = taskweave_testkit::paused_runtime();
    runtime.block_on(async move {
        let baseline = alive_tasks();
        let parent = CancellationToken::new();
        let pool = WorkerPool::builder(workers, capacity)
            .overflow(overflow)
            .take_per_worker(take)
            .spawn(
                parent.clone(),
                |context, (outcome, ms): (Outcome, u64)| async move {
                    tokio::select! {
                        () = context.cancelled() => return Err("interrupted".to_owned()),
                        () = tokio::time::sleep(Duration::from_millis(ms)) => {}
                    }
                    match outcome {
                        Outcome::Ok => Ok(ms),
                        Outcome::Error => Err("planned".to_owned()),
                        Outcome::Panic => panic!("planned panic"),
                    }
                },
            );
        // The submitter runs concurrently with the stop, which may come at any point.
        let submitter = {
            let pool = pool.clone();
            // A request's own token, a child of the parent: a cancellation of the parent
            // reaches the waiting submissions both ways (the pool closes; the token fires).
            let token = parent.child_token();
            tokio::spawn(async move {
                let mut refused = 0_u64;
                let mut jobs = jobs.into_iter();
                while let Some((job, mode)) = jobs.next() {
                    let mut batch = |n: usize| {
                        std::iter::once(job)
                            .chain(jobs.by_ref().take(n - 1).map(|(job, _)| job))
                            .collect::<Vec<_>>()
                    };
                    let refused_here = match mode {
                        Submit::Wait => u64::from(pool.submit(&token, job).await.is_err()),
                        Submit::Try => u64::from(pool.try_submit(job).is_err()),
                        Submit::Timeout(ms) => u64::from(!matches!(
                            tokio::time::timeout(
                                Duration::from_millis(ms),
                                pool.submit(&token, job)
                            )
                            .await,
                            Ok(Ok(_))
                        )),
                        Submit::Many(n, limit) => {
                            let batch = batch(n);
                            let given = batch.len() as u64;
                            // Only this task submits: what it queued shows in `submitted`.
                            let before = pool.metrics().submitted;
                            let submit = pool.submit_many(&token, batch);
                            let outcome = match limit {
                                None => Some(submit.await),
                                Some(ms) => tokio::time::timeout(Duration::from_millis(ms), submit)
                                    .await
                                    .ok(),
                            };
                            match outcome {
                                Some(Ok(indices)) => {
                                    assert_eq!(indices.end - indices.start, given);
                                    0
                                }
                                Some(Err(error)) => {
                                    assert_eq!(
                                        error.accepted.end - error.accepted.start
                                            + error.refused.len() as u64,
                                        given
                                    );
                                    error.refused.len() as u64
                                }
                                // Given up: what it had queued stays accepted.
                                None => given - (pool.metrics().submitted - before),
                            }
                        }
                        Submit::TryMany(n) => {
                            let batch = batch(n);
                            match pool.try_submit_many(batch) {
                                Ok(_) => 0,
                                Err(error) => error.refused.len() as u64,
                            }
                        }
                    };
                    refused += refused_here;
                    tokio::task::yield_now().await;
                }
                refused
            })
        };
        let report = match stop {
            Stop::Close(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                pool.close().await
            }
            Stop::CloseWithin(ms) => {
                tokio::time::sleep(Duration::from_millis(ms / 2)).await;
                pool.close_within(Duration::from_millis(ms / 2 + 1)).await
            }
            Stop::CancelThenClose(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                parent.cancel();
                pool.close().await
            }
        };
        let refused = submitter.await.unwrap();
        let metrics = pool.metrics();
        drop(pool);
        assert_no_leaked_tasks(baseline).await;
        (metrics, report.handed_back.len(), refused)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    // Every accepted job is completed, failed, panicked, dropped or handed back, and nothing
    // else; every refused, cancelled or abandoned submission is counted as not accepted; no
    // task outlives the pool. Submissions race the stop.
    #[test]
    fn every_accepted_job_is_accounted_for_exactly_once(
        jobs in proptest::collection::vec((outcome(), submit_mode()), 0..40),
        overflow in policy(),
        workers in 1_usize..4,
        capacity in 1_usize..6,
        take in 1_usize..5,
        stop in stop(),
    ) {
        let total = jobs.len() as u64;
        let (m, handed_back, refused) = simulate(jobs, overflow, workers, capacity, take, stop);
        prop_assert_eq!(m.submitted + refused, total);
        prop_assert_eq!(
            m.submitted,
            m.completed + m.failed + m.panicked + m.dropped + m.handed_back + m.abandoned
        );
        prop_assert_eq!(m.abandoned, 0, "no runtime shut down under the pool");
        prop_assert_eq!(m.handed_back, handed_back as u64);
        prop_assert_eq!((m.queued, m.in_flight, m.workers_alive), (0, 0, 0));
        if overflow != Overflow::DropOldest {
            prop_assert_eq!(m.dropped, 0);
        }
    }
}

/// Drop-oldest submitters on other OS threads racing a plain close on a multi-thread runtime:
/// every accepted job is accounted for exactly once, and a plain close hands nothing back:
/// each job was evicted (dropped) or queued (run), never caught in between. (The
/// proptest above runs on one thread, where a submission never interleaves with a close.)
#[test]
fn drop_oldest_submitters_on_other_threads_racing_a_close_balance_the_books() {
    const THREADS: u64 = 3;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for round in 0..20 {
        let pool = runtime.block_on(async {
            WorkerPool::builder(1, 1)
                .overflow(Overflow::DropOldest)
                .spawn(CancellationToken::new(), |_context, job: u64| async move {
                    Ok::<_, String>(job)
                })
        });
        // Each submits until the pool refuses, and returns how many times it tried.
        let submitters: Vec<_> = (0..THREADS)
            .map(|_| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    let mut attempts = 1;
                    while pool.try_submit(attempts).is_ok() {
                        attempts += 1;
                    }
                    attempts
                })
            })
            .collect();
        // Close while they are submitting.
        while pool.metrics().submitted < 300 {
            std::thread::yield_now();
        }
        let report = runtime.block_on(pool.close());
        let attempts: u64 = submitters.into_iter().map(|s| s.join().unwrap()).sum();
        let m = pool.metrics();
        assert_eq!(
            m.submitted + THREADS,
            attempts,
            "round {round}: one refusal each"
        );
        assert_books_balance(&m, &format!("round {round}"));
        assert_eq!(
            (m.handed_back, report.handed_back.len()),
            (0, 0),
            "round {round}: a plain close drains"
        );
        assert_eq!((m.queued, m.in_flight), (0, 0), "round {round}");
    }
}
