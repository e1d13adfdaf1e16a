//! `fan_out`: every item exactly once, bounded concurrency, stops on every exit path.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use proptest::prelude::*;
use taskweave_fan::fan_out;
use tokio_util::sync::CancellationToken;

use crate::{alive_tasks, assert_no_leaked_tasks};

#[tokio::test(start_paused = true)]
async fn every_item_is_processed_once_by_at_most_n_copies_at_a_time() {
    let baseline = alive_tasks();
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (r, p) = (Arc::clone(&running), Arc::clone(&peak));
    let mut out: Vec<u32> = fan_out(
        CancellationToken::new(),
        futures::stream::iter(0..50_u32),
        4,
        move |n| {
            let (running, peak) = (Arc::clone(&r), Arc::clone(&p));
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(u64::from(n % 7))).await;
                running.fetch_sub(1, Ordering::SeqCst);
                n
            }
        },
    )
    .collect()
    .await;
    out.sort_unstable();
    assert_eq!(out, (0..50).collect::<Vec<_>>());
    assert_eq!(peak.load(Ordering::SeqCst), 4);
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_call_is_counted_and_the_copy_keeps_serving() {
    let mut out = fan_out(
        CancellationToken::new(),
        futures::stream::iter(0..10_u32),
        1,
        |n| async move {
            assert!(n != 3, "item {n} is cursed");
            n
        },
    );
    let mut items = Vec::new();
    while let Some(item) = out.next().await {
        items.push(item);
    }
    assert_eq!(
        items,
        [0, 1, 2, 4, 5, 6, 7, 8, 9],
        "one copy, so the order is the input's"
    );
    assert_eq!(out.panicked(), 1);
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_token_stops_every_task_and_ends_the_output() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let endless = futures::stream::iter(0_u64..);
    let mut out = fan_out(token.clone(), endless, 3, |n| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        n
    });
    assert!(out.next().await.is_some());
    token.cancel();
    while out.next().await.is_some() {}
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn dropping_the_output_stops_every_task() {
    let baseline = alive_tasks();
    // An input that never yields: only the drop can stop the copy waiting on it (and the
    // one waiting for its turn).
    let never = futures::stream::pending::<u8>();
    let out = fan_out(CancellationToken::new(), never, 2, |n| async move { n });
    tokio::task::yield_now().await;
    assert_eq!(alive_tasks(), baseline + 2, "one task per copy, no feeder");
    drop(out);
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test]
#[should_panic(expected = "workers must be greater than zero")]
async fn zero_workers_is_a_programmer_error() {
    let _ = fan_out(
        CancellationToken::new(),
        futures::stream::iter([1]),
        0,
        |n: i32| async move { n },
    );
}

#[tokio::test]
#[should_panic(expected = "fan_out: 18446744073709551615 workers is more than MAX_WORKERS (65536)")]
async fn a_worker_count_near_usize_max_is_refused_before_anything_is_allocated() {
    let _ = fan_out(
        CancellationToken::new(),
        futures::stream::iter([1]),
        usize::MAX,
        |n: i32| async move { n },
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    // Whatever the timing, each item is processed exactly once.
    #[test]
    fn each_item_exactly_once(items in proptest::collection::vec(0_u64..20, 0..60), workers in 1_usize..6) {
        let runtime = taskweave_testkit::paused_runtime();
        let indexed: Vec<(usize, u64)> = items.iter().copied().enumerate().collect();
        let input = futures::stream::iter(indexed.clone());
        let mut out: Vec<(usize, u64)> = runtime.block_on(async move {
            fan_out(CancellationToken::new(), input, workers, |(index, ms)| async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                (index, ms)
            })
            .collect()
            .await
        });
        out.sort_unstable();
        prop_assert_eq!(out, indexed);
    }
}

#[tokio::test]
async fn a_panicking_input_is_caught_counted_and_ends_the_output() {
    let baseline = alive_tasks();
    let input = futures::stream::iter(0..10_u32).map(|n| {
        assert!(n != 4, "input broke at {n}");
        n
    });
    let mut out = fan_out(CancellationToken::new(), input, 3, |n| async move { n });
    let mut items = Vec::new();
    while let Some(item) = out.next().await {
        items.push(item);
    }
    items.sort_unstable();
    assert_eq!(items, [0, 1, 2, 3], "nothing after the panic is read");
    assert_eq!(out.panicked(), 1);
    assert_no_leaked_tasks(baseline).await;
}
