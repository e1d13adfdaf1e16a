//! `map_ordered`: input order, bounded concurrency and window, no stall, panics in place.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use proptest::prelude::*;
use taskweave_reorder::map_ordered;
use tokio_util::sync::CancellationToken;

use crate::{alive_tasks, assert_no_leaked_tasks};

#[tokio::test(start_paused = true)]
async fn results_keep_input_order_with_at_most_concurrency_calls_running() {
    let baseline = alive_tasks();
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (r, p) = (Arc::clone(&running), Arc::clone(&peak));
    let out: Vec<u64> = map_ordered(
        CancellationToken::new(),
        futures::stream::iter(0..40_u64),
        4,
        move |n| {
            let (running, peak) = (Arc::clone(&r), Arc::clone(&p));
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis((n * 7919) % 13)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                n * 2
            }
        },
    )
    .map(Result::unwrap)
    .collect()
    .await;
    assert_eq!(out, (0..40).map(|n| n * 2).collect::<Vec<_>>());
    assert_eq!(peak.load(Ordering::SeqCst), 4);
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn no_more_workers_than_the_input_promises_items_and_a_stream_that_breaks_its_promise_is_still_mapped()
 {
    let baseline = alive_tasks();
    let out = map_ordered(
        CancellationToken::new(),
        futures::stream::iter(0..3_u64),
        1_000,
        |n| async move { n + 1 },
    );
    assert_eq!(
        alive_tasks() - baseline,
        3,
        "one worker per item, not 1,000"
    );
    let got: Vec<u64> = out.map(Result::unwrap).collect().await;
    assert_eq!(got, [1, 2, 3]);
    assert_no_leaked_tasks(baseline).await;

    // A stream whose size_hint promises one item and yields five: fewer workers, every item.
    struct Understated(std::ops::Range<u64>);
    impl futures::Stream for Understated {
        type Item = u64;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<u64>> {
            std::task::Poll::Ready(self.0.next())
        }
        fn size_hint(&self) -> (usize, Option<usize>) {
            (0, Some(1))
        }
    }
    let got: Vec<u64> = map_ordered(
        CancellationToken::new(),
        Understated(0..5),
        8,
        |n| async move {
            tokio::task::yield_now().await;
            n * 10
        },
    )
    .map(Result::unwrap)
    .collect()
    .await;
    assert_eq!(got, [0, 10, 20, 30, 40]);
}

#[tokio::test(start_paused = true)]
async fn a_slow_item_holds_the_input_back_by_at_most_twice_the_concurrency() {
    let read = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&read);
    let input = futures::stream::iter(0..100_u64).inspect(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    let mut out = map_ordered(CancellationToken::new(), input, 3, |n| async move {
        if n == 0 {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        n
    });
    let mut first = tokio_test::task::spawn(out.next());
    tokio_test::assert_pending!(first.poll());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(read.load(Ordering::SeqCst), 6, "a window of 2 x 3 items");
    tokio_test::assert_pending!(first.poll());
    assert_eq!(first.await.map(Result::unwrap), Some(0));
    assert_eq!(out.waiting(), 5, "items 1..=5 finished long ago");
    let rest: Vec<u64> = out.map(Result::unwrap).collect().await;
    assert_eq!(rest, (1..100).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn calls_go_on_while_the_consumer_awaits_in_its_loop_unlike_buffered() {
    let ours = Arc::new(AtomicUsize::new(0));
    let theirs = Arc::new(AtomicUsize::new(0));
    let call = |done: Arc<AtomicUsize>| {
        move |n: u64| {
            let done = Arc::clone(&done);
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                done.fetch_add(1, Ordering::SeqCst);
                n
            }
        }
    };
    let mut ordered = map_ordered(
        CancellationToken::new(),
        futures::stream::iter(0..20),
        4,
        call(Arc::clone(&ours)),
    );
    let mut buffered = futures::stream::iter(0..20)
        .map(call(Arc::clone(&theirs)))
        .buffered(4);
    assert_eq!(ordered.next().await.map(Result::unwrap), Some(0));
    assert_eq!(buffered.next().await, Some(0));
    // The consumer now awaits something else for a second.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stalled = theirs.load(Ordering::SeqCst);
    assert!(
        stalled <= 4,
        "buffered(4) stalled with its consumer: {stalled} calls done"
    );
    assert_eq!(
        ours.load(Ordering::SeqCst),
        8,
        "the whole window (2 x 4) ran on while the consumer waited"
    );
}

#[tokio::test]
async fn a_panic_becomes_an_error_in_its_place_and_the_rest_goes_on() {
    let baseline = alive_tasks();
    let out: Vec<_> = map_ordered(
        CancellationToken::new(),
        futures::stream::iter(0..6_u32),
        2,
        |n| async move {
            assert!(n != 2, "item {n} is cursed");
            n
        },
    )
    .collect()
    .await;
    assert_eq!(out.len(), 6);
    for (n, result) in out.iter().enumerate() {
        match result {
            Ok(value) => assert_eq!(*value as usize, n),
            Err(panic) => {
                assert_eq!(n, 2);
                assert_eq!(panic.message(), "item 2 is cursed");
                assert!(panic.name().starts_with("map-ordered-"));
            }
        }
    }
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test]
async fn a_panicking_input_ends_the_output_with_an_error_at_its_place() {
    let baseline = alive_tasks();
    let input = futures::stream::iter(0..5_u32).map(|n| {
        assert!(n < 3, "input broke at {n}");
        n
    });
    let out: Vec<_> = map_ordered(CancellationToken::new(), input, 2, |n| async move { n })
        .collect()
        .await;
    assert_eq!(out.len(), 4);
    assert!(
        out[..3]
            .iter()
            .enumerate()
            .all(|(i, r)| r.as_ref().ok() == Some(&(i as u32)))
    );
    assert_eq!(out[3].as_ref().unwrap_err().message(), "input broke at 3");
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn cancel_ends_the_output_at_once_and_stops_every_task() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let mut out = map_ordered(
        token.clone(),
        futures::stream::iter(0..),
        4,
        |n: u64| async move {
            tokio::time::sleep(Duration::from_secs(n % 3)).await;
            n
        },
    );
    assert_eq!(out.next().await.map(Result::unwrap), Some(0));
    token.cancel();
    assert!(out.next().await.is_none());
    assert!(out.was_cancelled());
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn dropping_the_output_stops_every_task() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let mut out = map_ordered(
        token.clone(),
        futures::stream::iter(0..),
        4,
        |n: u64| async move {
            std::future::pending::<()>().await;
            n
        },
    );
    let mut next = tokio_test::task::spawn(out.next());
    tokio_test::assert_pending!(next.poll());
    drop(next);
    drop(out);
    assert_no_leaked_tasks(baseline).await;
    assert!(!token.is_cancelled(), "only its own child token");
}

#[tokio::test]
#[should_panic(expected = "map_ordered: concurrency must be greater than zero")]
async fn zero_concurrency_panics() {
    let _ = map_ordered(
        CancellationToken::new(),
        futures::stream::iter([1]),
        0,
        |n: i32| async move { n },
    );
}

#[tokio::test]
#[should_panic(
    expected = "map_ordered: concurrency 18446744073709551615 is above MAX_CONCURRENCY (65536)"
)]
async fn a_concurrency_near_usize_max_is_refused_before_anything_is_allocated() {
    let _ = map_ordered(
        CancellationToken::new(),
        futures::stream::iter([1]),
        usize::MAX,
        |n: i32| async move { n },
    );
}

proptest! {
    /// Random call delays and a consumer that sometimes waits: the window fills, permits are
    /// reused, and the order holds.
    #[test]
    fn order_is_kept_under_random_delays(
        delays in proptest::collection::vec((0_u64..50, 0_u64..30), 0..60),
        concurrency in 1_usize..6,
    ) {
        let runtime = taskweave_testkit::paused_runtime();
        let expected: Vec<usize> = (0..delays.len()).collect();
        let consumer_waits: Vec<u64> = delays.iter().map(|&(_, wait)| wait).collect();
        let input = futures::stream::iter(delays.into_iter().map(|(call, _)| call).enumerate());
        let (out, cancelled) = runtime.block_on(async move {
            let mut results =
                map_ordered(CancellationToken::new(), input, concurrency, |(i, ms)| async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    i
                });
            let mut out = Vec::new();
            while let Some(result) = results.next().await {
                let i = result.unwrap();
                tokio::time::sleep(Duration::from_millis(consumer_waits[i])).await;
                out.push(i);
            }
            (out, results.was_cancelled())
        });
        prop_assert_eq!(out, expected);
        prop_assert!(!cancelled);
    }
}
