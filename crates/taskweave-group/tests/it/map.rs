//! Ordered parallel map: input order, first failure cancels, collect-all, limits.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use taskweave_group::{PanicError, TaskFailure, map_parallel, map_parallel_all};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::support::{Concurrency, alive_tasks, assert_no_leaked_tasks};
use taskweave_testkit::Counted;

#[tokio::test(start_paused = true)]
async fn results_come_back_in_input_order_with_the_limit_respected() {
    let concurrency = Concurrency::default();
    let tracker = concurrency.clone();
    let delays = [50_u64, 10, 40, 20, 30, 5, 45];
    let results = map_parallel(CancellationToken::new(), delays, 3, move |_token, ms| {
        let tracker = tracker.clone();
        async move {
            let _inside = tracker.enter();
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, String>(ms * 2)
        }
    })
    .await
    .unwrap();
    assert_eq!(results, delays.map(|ms| ms * 2));
    assert_eq!(concurrency.peak(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_first_failure_cancels_the_rest_and_stops_new_calls() {
    let baseline = alive_tasks();
    let started = Instant::now();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let failure = map_parallel(CancellationToken::new(), 0..100_u64, 4, move |token, n| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 2 {
                tokio::time::sleep(Duration::from_millis(15)).await;
                return Err(format!("item {n} failed"));
            }
            tokio::select! {
                () = token.cancelled() => Err(format!("item {n} cancelled")),
                () = tokio::time::sleep(Duration::from_millis(10)) => Ok(n),
            }
        }
    })
    .await
    .unwrap_err();
    assert!(matches!(&failure, TaskFailure::Failed(message) if message == "item 2 failed"));
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(15),
        "the calls in flight stopped"
    );
    // 0..=3 at 0 ms, 4..=6 at 10 ms when 0, 1 and 3 finished; none after the failure at 15.
    assert_eq!(
        calls.load(Ordering::SeqCst),
        7,
        "no call started after the failure"
    );
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_call_is_a_failure() {
    let failure = map_parallel(
        CancellationToken::new(),
        [1, 2, 3],
        2,
        |_token, n: u8| async move {
            assert!(n != 2, "bad item");
            Ok::<_, String>(n)
        },
    )
    .await
    .unwrap_err();
    assert!(failure.is_panic());
}

#[tokio::test(start_paused = true)]
async fn collect_all_runs_everything_and_keeps_every_outcome_in_order() {
    let outcomes = map_parallel_all(
        CancellationToken::new(),
        0..6_u64,
        2,
        |_token, n| async move {
            tokio::time::sleep(Duration::from_millis(10 - n)).await;
            if n % 3 == 0 {
                Err(format!("{n} is divisible by 3"))
            } else {
                Ok(n)
            }
        },
    )
    .await;
    let summary: Vec<Result<u64, String>> = outcomes
        .into_iter()
        .map(|outcome| outcome.map_err(|failure| failure.to_string()))
        .collect();
    assert_eq!(
        summary,
        [
            Err("0 is divisible by 3".to_owned()),
            Ok(1),
            Ok(2),
            Err("3 is divisible by 3".to_owned()),
            Ok(4),
            Ok(5)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn items_not_started_before_the_callers_cancellation_are_reported() {
    let token = CancellationToken::new();
    let canceller = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(15)).await;
        canceller.cancel();
    });
    let outcomes = map_parallel_all(token, 0..5_u64, 1, |_token, n| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok::<_, String>(n)
    })
    .await;
    // Item 0 ran 0..10 ms, item 1 10..20 ms (started before the cancel); 2..4 never started.
    assert_eq!(outcomes.len(), 5, "one outcome per item");
    assert!(outcomes[0].is_ok() && outcomes[1].is_ok());
    assert!(
        outcomes[2..]
            .iter()
            .all(|o| matches!(o, Err(TaskFailure::NotStarted)))
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_the_map_aborts_its_calls() {
    let baseline = alive_tasks();
    let map = map_parallel(CancellationToken::new(), 0..10, 3, |_token, _n: u8| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, String>(())
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(5), map)
            .await
            .is_err()
    );
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test]
#[should_panic(expected = "limit must be greater than zero")]
async fn a_zero_limit_is_a_programmer_error() {
    let _ = map_parallel(CancellationToken::new(), [1], 0, |_t, n: u8| async move {
        Ok::<_, String>(n)
    })
    .await;
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    // Whatever order the calls complete in, the results come back in input order.
    #[test]
    fn results_keep_input_order_under_random_completion_order(
        delays in proptest::collection::vec(0_u64..50, 0..40),
        limit in 1_usize..8,
    ) {
        let runtime = taskweave_testkit::paused_runtime();
        let expected: Vec<(usize, u64)> = delays.iter().copied().enumerate().collect();
        let inputs = expected.clone();
        let results = runtime.block_on(map_parallel(
            CancellationToken::new(),
            inputs,
            limit,
            |_token, (index, ms)| async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok::<_, String>((index, ms))
            },
        ));
        prop_assert_eq!(results.unwrap(), expected);
    }
}

#[tokio::test(start_paused = true)]
async fn an_already_cancelled_token_starts_no_call() {
    let token = CancellationToken::new();
    token.cancel();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let outcomes = map_parallel_all(token.clone(), 0..5_u32, 2, move |_token, n| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, String>(n) }
    })
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(outcomes.len(), 5, "one outcome per item");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Err(TaskFailure::NotStarted)))
    );
    let failure = map_parallel(
        token,
        0..5_u32,
        2,
        |_token, n| async move { Ok::<_, String>(n) },
    )
    .await
    .unwrap_err();
    assert!(matches!(failure, TaskFailure::NotStarted));
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_callers_token_cancels_the_calls_in_flight() {
    let token = CancellationToken::new();
    let canceller = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        canceller.cancel();
    });
    let started = Instant::now();
    let outcomes = map_parallel_all(token, 0..10_u32, 3, |call_token, n| async move {
        call_token.cancelled().await;
        Err::<u32, _>(format!("item {n} saw its token"))
    })
    .await;
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(5),
        "the calls saw their tokens at once"
    );
    for (index, outcome) in outcomes.iter().enumerate() {
        match outcome {
            Err(TaskFailure::Failed(message)) => {
                assert!(index < 3, "only the first three ran");
                assert_eq!(message, &format!("item {index} saw its token"));
            }
            Err(TaskFailure::NotStarted) => assert!(index >= 3),
            other => panic!("item {index}: {other:?}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn collect_all_reports_a_panicking_call_at_its_index() {
    let outcomes = map_parallel_all(
        CancellationToken::new(),
        0..4_u8,
        2,
        |_token, n| async move {
            assert!(n != 1, "bad item");
            Ok::<_, String>(n)
        },
    )
    .await;
    assert!(outcomes[1].as_ref().unwrap_err().is_panic());
    assert_eq!(outcomes.iter().filter(|o| o.is_ok()).count(), 3);
}

/// The panic an outcome reports; any other outcome fails the test.
fn panic_of<R: std::fmt::Debug>(outcome: &Result<R, TaskFailure<String>>) -> &PanicError {
    match outcome {
        Err(TaskFailure::Panicked(panic)) => panic,
        other => panic!("expected a panic, got {other:?}"),
    }
}

// `f` is called on the call's task, inside its catch: a panic before its future exists is
// that item's panic, not the caller's.
#[tokio::test(start_paused = true)]
async fn a_panic_in_the_synchronous_part_of_a_call_is_that_items_failure() {
    let outcomes = map_parallel_all(CancellationToken::new(), 0..4_u8, 2, |_token, n| {
        assert!(n != 2, "bad item, before any future");
        async move { Ok::<_, String>(n * 10) }
    })
    .await;
    let panic = panic_of(&outcomes[2]);
    assert_eq!(panic.message(), "bad item, before any future");
    // Caught with the capture on, as a panic inside the call's future would be.
    assert!(panic.location().is_some(), "{panic:?}");
    let values: Vec<_> = outcomes
        .iter()
        .filter_map(|outcome| outcome.as_ref().ok().copied())
        .collect();
    assert_eq!(values, [0, 10, 30]);
}

// A call's future is kept until the catch around it drops it: a destructor that panics after
// the call returned is that item's panic, caught with the capture on (a panic tokio caught
// instead would come back without a location), and nothing waits for it.
#[tokio::test(start_paused = true)]
async fn a_call_whose_future_panics_in_its_destructor_is_that_items_failure() {
    type Call = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
    let baseline = alive_tasks();
    let outcomes = tokio::time::timeout(
        Duration::from_secs(5),
        map_parallel_all(CancellationToken::new(), 0..3_u8, 2, |_token, n| -> Call {
            if n == 1 {
                Box::pin(taskweave_testkit::ReadyThenPanicOnDrop::new(
                    "the call's future",
                ))
            } else {
                Box::pin(async { Ok(()) })
            }
        }),
    )
    .await
    .expect("the map hung");
    assert!(outcomes[0].is_ok() && outcomes[2].is_ok(), "{outcomes:?}");
    let panic = panic_of(&outcomes[1]);
    assert_eq!(panic.message(), "the call's future panicked in its Drop");
    assert!(panic.location().is_some(), "{panic:?}");
    assert_no_leaked_tasks(baseline).await;
}

// `f` is called at a call's first poll: a map dropped before its calls ran never calls it,
// and every item it read is dropped with the aborted calls (the rest with the input).
#[tokio::test(start_paused = true)]
async fn a_call_aborted_before_its_first_poll_never_calls_f_and_drops_its_item() {
    let baseline = alive_tasks();
    let (called, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let items: Vec<_> = (0..5).map(|_| Counted(Arc::clone(&dropped))).collect();
    let f = {
        let called = Arc::clone(&called);
        move |_token, item: Counted| {
            called.fetch_add(1, Ordering::SeqCst);
            async move {
                drop(item);
                Ok::<_, String>(())
            }
        }
    };
    let mut map = tokio_test::task::spawn(map_parallel(CancellationToken::new(), items, 2, f));
    // One poll spawns two calls, which this current-thread runtime has not run yet.
    assert!(map.poll().is_pending());
    assert_eq!(alive_tasks(), baseline + 2);
    drop(map);
    assert_no_leaked_tasks(baseline).await;
    assert_eq!(
        called.load(Ordering::SeqCst),
        0,
        "f ran for an aborted call"
    );
    assert_eq!(dropped.load(Ordering::SeqCst), 5, "an item was leaked");
}

#[tokio::test(start_paused = true)]
async fn a_huge_limit_means_no_limit() {
    let results = map_parallel(
        CancellationToken::new(),
        0..50_u32,
        usize::MAX,
        |_token, n| async move { Ok::<_, String>(n) },
    )
    .await
    .unwrap();
    assert_eq!(results, (0..50).collect::<Vec<_>>());
}

// Each call's token is its own: a map that ends normally cancels none of them, a call that
// cancels its own token (a drop guard) cancels no later call, and a map that stops at a
// failure cancels the ones in flight.
#[tokio::test(start_paused = true)]
async fn each_calls_token_is_its_own_and_left_alone_by_a_map_that_succeeds() {
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&tokens);
    let results = map_parallel(CancellationToken::new(), 0..20_u64, 3, move |token, n| {
        seen.lock().unwrap().push(token.clone());
        async move {
            let started_cancelled = token.is_cancelled();
            tokio::time::sleep(Duration::from_millis(n % 4)).await;
            if n % 2 == 0 {
                // Stops its helpers on the way out, as a drop guard would.
                token.cancel();
            }
            Ok::<_, String>((n, started_cancelled))
        }
    })
    .await
    .unwrap();
    assert_eq!(
        results,
        (0..20).map(|n| (n, false)).collect::<Vec<_>>(),
        "no call started with a cancelled token"
    );
    {
        let tokens = tokens.lock().unwrap();
        assert_eq!(tokens.len(), 20);
        for (n, token) in tokens.iter().enumerate() {
            assert_eq!(token.is_cancelled(), n % 2 == 0, "call {n}");
        }
    }

    let slow = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&slow);
    let failed = map_parallel(CancellationToken::new(), 0..20_u64, 3, move |token, n| {
        if n > 0 {
            seen.lock().unwrap().push(token.clone());
        }
        async move {
            if n == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                return Err("first".to_string());
            }
            token.cancelled().await;
            Ok(n)
        }
    })
    .await;
    assert!(matches!(failed, Err(TaskFailure::Failed(message)) if message == "first"));
    let slow = slow.lock().unwrap();
    assert_eq!(slow.len(), 2, "items 1 and 2 were in flight");
    assert!(slow.iter().all(CancellationToken::is_cancelled));
}

#[tokio::test(start_paused = true)]
async fn a_cancel_after_every_item_started_returns_the_values_that_all_came_back() {
    // Two items, a limit of two: both run before the cancel, and both ignore their token.
    let token = CancellationToken::new();
    let canceller = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        canceller.cancel();
    });
    let values = map_parallel(token, vec![1_u32, 2], 2, |_token, n| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok::<_, String>(n * 10)
    })
    .await
    .expect("every item ran and came back");
    assert_eq!(values, [10, 20]);
    // An empty input with a token already cancelled: nothing to run, nothing missing.
    let token = CancellationToken::new();
    token.cancel();
    let none = map_parallel(token, Vec::<u32>::new(), 2, |_token, n| async move {
        Ok::<_, String>(n)
    })
    .await
    .expect("an empty input has no item left unstarted");
    assert!(none.is_empty());
}

/// An output whose `Drop` panics.
struct PanicsWhenDropped;

impl Drop for PanicsWhenDropped {
    fn drop(&mut self) {
        panic!("discarded outcome dropped");
    }
}

#[tokio::test(start_paused = true)]
async fn outcomes_a_failure_discards_are_dropped_without_unwinding_through_the_caller() {
    let failure = map_parallel(
        CancellationToken::new(),
        0..3_u32,
        3,
        |_token, n| async move {
            if n == 0 {
                return Err("item 0 failed".to_owned());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok(PanicsWhenDropped)
        },
    )
    .await
    .err()
    .expect("the first failure");
    assert!(matches!(failure, TaskFailure::Failed(message) if message == "item 0 failed"));
}
