//! Sources and stages: what each yields, in which order, and how far ahead they run.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::stream::FusedStream;
use futures::{Stream, StreamExt};
use proptest::prelude::*;
use taskweave_pipeline::{Pipeline, PipelineExt, StageEnd};
use tokio_util::sync::CancellationToken;

use crate::{alive_tasks, assert_no_leaked_tasks};

fn pipeline() -> Pipeline {
    Pipeline::new(CancellationToken::new())
}

#[tokio::test]
async fn sources_send_their_items_in_order() {
    let p = pipeline();
    assert_eq!(p.iter(0..4).collect::<Vec<_>>().await, [0, 1, 2, 3]);
    assert_eq!(
        p.stream(futures::stream::iter("ab".chars()))
            .collect::<String>()
            .await,
        "ab"
    );
    let countdown = p.unfold(3_u8, |n| async move { (n > 0).then_some((n, n - 1)) });
    assert_eq!(countdown.collect::<Vec<_>>().await, [3, 2, 1]);
}

#[tokio::test]
async fn repeat_cycles_until_first_has_enough_and_then_stops() {
    let baseline = alive_tasks();
    let p = pipeline();
    let seven: Vec<char> = p.repeat(['a', 'b', 'c']).first(7).collect().await;
    assert_eq!(seven, ['a', 'b', 'c', 'a', 'b', 'c', 'a']);
    // The endless source stopped: `first` dropped it after the seventh item.
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test]
async fn repeat_of_nothing_ends_at_once() {
    let p = pipeline();
    let mut empty = p.repeat(Vec::<u8>::new());
    assert_eq!(empty.next().await, None);
    assert!(matches!(empty.end(), Some(StageEnd::InputEnded)));
}

#[tokio::test]
async fn first_zero_drops_its_input_without_reading_it() {
    let baseline = alive_tasks();
    let p = pipeline();
    let read = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&read);
    let source = p.repeat([1_u8]).spawn_map(&p, move |n| {
        r.fetch_add(1, Ordering::SeqCst);
        async move { n }
    });
    let mut none = source.first(0);
    assert!(none.get_ref().is_none());
    assert_eq!(none.next().await, None);
    assert_no_leaked_tasks(baseline).await;
    // The map stage was stopped before it ever ran: its token was cancelled first.
    assert_eq!(read.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn first_stops_at_the_input_end_when_it_comes_first() {
    let p = pipeline();
    let mut two = p.iter([1, 2]).first(5);
    assert_eq!(two.size_hint().1, Some(5));
    assert_eq!((&mut two).collect::<Vec<_>>().await, [1, 2]);
    let input = two.get_ref().expect("kept: it ended before n items");
    assert!(matches!(input.end(), Some(StageEnd::InputEnded)));
    assert_eq!(two.remaining(), 3);
}

#[tokio::test]
async fn filter_map_drops_the_nones() {
    let p = pipeline();
    let parsed = p
        .iter(["1", "two", "3", ""])
        .spawn_filter_map(&p, |s| async move { s.parse::<i32>().ok() });
    assert_eq!(parsed.collect::<Vec<_>>().await, [1, 3]);
}

#[tokio::test]
async fn try_map_applies_to_ok_and_passes_errors_through_in_place() {
    let p = pipeline();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let out: Vec<Result<i32, String>> = p
        .iter([Ok(1), Err("bad record 2".to_string()), Ok(3), Ok(-4)])
        .spawn_try_map(&p, move |n: i32| {
            c.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 0 {
                    Err(format!("negative: {n}"))
                } else {
                    Ok(n * 10)
                }
            }
        })
        .collect()
        .await;
    assert_eq!(
        out,
        [
            Ok(10),
            Err("bad record 2".to_string()),
            Ok(30),
            Err("negative: -4".to_string())
        ]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3, "never called for an Err");
}

#[tokio::test]
async fn stages_accept_any_stream_and_compose_with_stream_ext() {
    let p = pipeline();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        for n in 0..5 {
            tx.send(n).await.unwrap();
        }
    });
    let input =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|n| (n, rx)) });
    let out: Vec<i32> = input
        .spawn_map(&p, |n| async move { n + 1 })
        .map(|n| n * 2) // futures' StreamExt::map, in between
        .spawn_filter(&p, |n| *n > 4)
        .collect()
        .await;
    assert_eq!(out, [6, 8, 10]);
}

#[tokio::test(start_paused = true)]
async fn a_stage_runs_at_most_its_capacity_ahead_of_a_consumer_that_does_not_read() {
    let p = pipeline().with_capacity(2);
    let produced = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&produced);
    let mut out = p
        .iter((0..1_000).inspect(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        }))
        .spawn_map(&p, |n| async move { n });
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    // Two in each output channel; a stage takes items only into the room of its output.
    let ahead = produced.load(Ordering::SeqCst);
    assert!((2..=6).contains(&ahead), "produced {ahead}");
    assert_eq!(out.len(), 2);
    assert_eq!(out.size_hint(), (2, None));
    assert_eq!(out.next().await, Some(0));
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(produced.load(Ordering::SeqCst) <= 7);
}

#[test]
#[should_panic(
    expected = "Pipeline::with_capacity: 18446744073709551615 is above MAX_CAPACITY (1048576)"
)]
fn a_capacity_near_usize_max_is_refused_before_anything_is_allocated() {
    let _ = pipeline().with_capacity(usize::MAX);
}

#[test]
#[should_panic(expected = "Pipeline::with_capacity: capacity must be greater than zero")]
fn zero_capacity_panics() {
    let _ = pipeline().with_capacity(0);
}

proptest! {
    #[test]
    fn map_filter_map_equals_the_iterator_chain(
        items in proptest::collection::vec(any::<i32>(), 0..200),
        capacity in 1_usize..8,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let expected: Vec<i64> = items
            .iter()
            .map(|&n| i64::from(n) * 3)
            .filter(|n| n % 2 == 0)
            .map(|n| n - 1)
            .collect();
        let got: Vec<i64> = runtime.block_on(async move {
            let p = pipeline().with_capacity(capacity);
            p.iter(items)
                .spawn_map(&p, |n| async move { i64::from(n) * 3 })
                .spawn_filter(&p, |n| n % 2 == 0)
                .spawn_map(&p, |n| async move { n - 1 })
                .collect()
                .await
        });
        prop_assert_eq!(got, expected);
    }
}

#[tokio::test]
async fn first_is_terminated_after_n_items_without_another_poll() {
    let p = pipeline();
    let mut two = p.repeat([1]).first(2);
    assert!(!two.is_terminated());
    assert_eq!(two.next().await, Some(1));
    assert_eq!(two.size_hint().1, Some(1), "one item left at most");
    assert_eq!(two.next().await, Some(1));
    assert!(two.is_terminated());
    assert_eq!(two.size_hint(), (0, Some(0)));
    assert!(two.get_ref().is_none(), "the input is dropped at once");
}

#[tokio::test]
async fn a_filter_over_an_always_ready_input_lets_the_canceller_run() {
    // On one thread: the filter keeps nothing, so it never waits to send; without giving
    // way to other tasks it would starve the task that cancels it (the input is finite so
    // that such a stage ends, `InputEnded`, instead of hanging the test).
    let token = CancellationToken::new();
    let p = Pipeline::new(token.clone());
    let mut nothing = futures::stream::iter(0_u64..10_000_000).spawn_filter(&p, |_| false);
    let canceller = tokio::spawn(async move {
        tokio::task::yield_now().await;
        token.cancel();
    });
    assert_eq!(nothing.next().await, None);
    assert!(matches!(nothing.end(), Some(StageEnd::Cancelled)));
    canceller.await.unwrap();
}

#[tokio::test]
async fn a_stage_over_an_always_ready_input_gives_way_within_1024_items() {
    // On one thread, the stage is polled before the observer (tokio runs tasks in the order
    // they were woken). It runs on its whole budget, one unit per 8 items: the observer gets
    // its turn after at most 128 × 8 items. Spending the budget once per turn (of up to 32
    // items here) would let 4,096 through first; spending none, all of them (the input is
    // finite so that such a stage ends instead of hanging the test).
    let token = CancellationToken::new();
    let p = Pipeline::new(token.clone());
    let seen = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&seen);
    let mut nothing = futures::stream::iter(0_u64..1_000_000).spawn_filter(&p, move |_| {
        counted.fetch_add(1, Ordering::Relaxed);
        false
    });
    let observer = {
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            let before = seen.load(Ordering::Relaxed);
            token.cancel();
            before
        })
    };
    assert_eq!(nothing.next().await, None);
    let before_the_observer = observer.await.unwrap();
    assert!(
        (1..=1024).contains(&before_the_observer),
        "the stage ran {before_the_observer} items before another task"
    );
}
