//! The batched hand-off between stages: what a stage holds, when it hands on, and what is
//! kept on a cancel, a panic or a consumer that leaves.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use taskweave_pipeline::{Pipeline, PipelineExt, StageEnd};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::{alive_tasks, assert_no_leaked_tasks};
use taskweave_testkit::Counted;

/// Waits on the paused clock until `done` holds, failing (instead of hanging) after a
/// second of virtual time.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(1), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "never happened: {what}");
}

/// Asserts that `out`'s stage ended with a panic of `stage` saying `message`; returns it.
fn assert_stage_panicked<T>(
    out: &taskweave_pipeline::Stage<T>,
    stage: &str,
    message: &str,
) -> taskweave_pipeline::PanicError {
    let panic = out
        .end()
        .and_then(StageEnd::panic)
        .expect("the stage ended with a panic")
        .clone();
    assert_eq!((panic.name().as_ref(), panic.message()), (stage, message));
    panic
}

#[tokio::test(start_paused = true)]
async fn room_comes_back_with_each_item_the_consumer_takes_not_with_each_batch() {
    let p = Pipeline::new(CancellationToken::new()).with_capacity(4);
    let mut out = p.iter(0..100_u32).spawn_map(&p, |n| async move { n });
    eventually("the map's output fills", || out.len() == 4).await;
    // The consumer moves the four into its own buffer and yields one; the one room it made
    // lets the map send one more, although three of the batch are still unread.
    assert_eq!(out.next().await, Some(0));
    assert_eq!(out.len(), 3);
    eventually("the map sends into the room of one item", || out.len() == 4).await;
    let rest: Vec<u32> = out.take(5).collect().await;
    assert_eq!(rest, [1, 2, 3, 4, 5]);
}

#[tokio::test(start_paused = true)]
async fn a_consumer_that_waits_on_the_producer_after_one_item_is_not_stuck() {
    // The consumer takes one item, then waits for something the source does only after it
    // sent the next (capacity + 1)th item. Room counted per batch would deadlock here.
    let p = Pipeline::new(CancellationToken::new()).with_capacity(3);
    let pulled = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&pulled);
    let mut out = p.iter((0..10_u32).inspect(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    }));
    eventually("the source fills its output", || out.len() == 3).await;
    assert_eq!(out.next().await, Some(0));
    eventually("the source pulls item 3 into the freed room", || {
        pulled.load(Ordering::SeqCst) >= 4
    })
    .await;
    assert_eq!(out.collect::<Vec<_>>().await, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
}

/// A source of `0..items` that counts the items it pulls, into a map whose step for item 0
/// waits on a gate; each output holds `capacity` items. A stage reading a `Stage` pops items
/// without a read-modify-write per item, yet the room of what it took (and, past 32 items,
/// the wake-up of a source waiting for it) must reach the source before the map waits:
/// checked by how many items the source pulls meanwhile, `pulled_while_waiting`. Then the
/// gate opens and every item arrives, in order.
async fn a_map_waiting_on_its_first_item(capacity: usize, items: u32, pulled_while_waiting: usize) {
    let gate = Arc::new(Semaphore::new(0));
    let p = Pipeline::new(CancellationToken::new()).with_capacity(capacity);
    let pulled = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&pulled);
    let opened = Arc::clone(&gate);
    let out = p
        .iter((0..items).inspect(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        }))
        .spawn_map(&p, move |n| {
            let gate = Arc::clone(&opened);
            async move {
                if n == 0 {
                    gate.acquire().await.unwrap().forget();
                }
                n
            }
        });
    eventually(
        "the source refills the room of the items the map took",
        || pulled.load(Ordering::SeqCst) >= pulled_while_waiting,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        pulled.load(Ordering::SeqCst),
        pulled_while_waiting,
        "the map's output and the source's output full, no more"
    );
    assert!(out.is_empty(), "nothing passes the waiting call");
    gate.add_permits(1);
    assert_eq!(
        out.collect::<Vec<_>>().await,
        (0..items).collect::<Vec<_>>()
    );
}

#[tokio::test(start_paused = true)]
async fn a_stage_whose_step_waits_gives_back_the_room_of_the_items_it_took() {
    // The map took 0 and 1 (both fit in its output of two); 0 waits in its step. Their room
    // in the source's output came back at once, and 2 and 3 fill it: four pulled.
    a_map_waiting_on_its_first_item(2, 10, 4).await;
}

#[tokio::test(start_paused = true)]
async fn a_stage_whose_step_waits_wakes_the_stage_before_it_after_a_large_take() {
    // The map took all 40 the source had sent (the source waiting for room by then), a take
    // past 32 whose wake-up waits for the end of the map's turn; 0 waits in its step, and
    // the source, woken before the map waits, sends 40 more: eighty pulled.
    a_map_waiting_on_its_first_item(40, 200, 80).await;
}

#[tokio::test(start_paused = true)]
async fn a_source_whose_iterator_panics_hands_on_every_item_before_the_panic() {
    let p = Pipeline::new(CancellationToken::new()).with_capacity(16);
    let mut out = p
        .named("numbers")
        .iter((0..10_u32).inspect(|&n| assert!(n != 5, "five")));
    assert_eq!((&mut out).collect::<Vec<_>>().await, [0, 1, 2, 3, 4]);
    let panic = out.end().and_then(StageEnd::panic).expect("the panic");
    assert_eq!(
        (panic.name().as_ref(), panic.message()),
        ("numbers", "five")
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_that_waits_hands_on_the_items_finished_before_it() {
    let gate = Arc::new(Semaphore::new(0));
    let p = Pipeline::new(CancellationToken::new()).with_capacity(8);
    let opened = Arc::clone(&gate);
    let mut out = p.iter(0..5_u32).spawn_map(&p, move |n| {
        let gate = Arc::clone(&opened);
        async move {
            if n == 2 {
                gate.acquire().await.unwrap().forget();
            }
            n
        }
    });
    // 0 and 1 were taken in the same batch as 2, and arrive while 2 waits (on the paused
    // clock, a missing hand-on fails the timeout instead of hanging).
    let first_two = tokio::time::timeout(
        Duration::from_secs(1),
        (&mut out).take(2).collect::<Vec<_>>(),
    );
    assert_eq!(first_two.await.expect("0 and 1 held back"), [0, 1]);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(out.is_empty(), "nothing passes the waiting call");
    gate.add_permits(1);
    assert_eq!(out.collect::<Vec<_>>().await, [2, 3, 4]);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_between_two_items_of_a_batch_keeps_the_items_finished() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let p = Pipeline::new(token.clone()).with_capacity(8);
    let canceller = token.clone();
    let mut out = p.iter(0..8_u32).spawn_map(&p, move |n| {
        // Item 1 cancels the pipeline and finishes; the stage stops before item 2.
        if n == 1 {
            canceller.cancel();
        }
        async move { n * 10 }
    });
    let got: Vec<u32> = (&mut out).collect().await;
    assert_eq!(got, [0, 10], "the two finished items, then the end");
    assert!(matches!(out.end(), Some(StageEnd::Cancelled)));
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_the_middle_of_a_batch_keeps_the_items_finished_before_it() {
    let p = Pipeline::new(CancellationToken::new()).with_capacity(16);
    let mut out = p.iter(0..10_u32).spawn_filter(&p.named("picky"), |n| {
        assert!(*n != 6, "six");
        n % 2 == 0
    });
    assert_eq!((&mut out).collect::<Vec<_>>().await, [0, 2, 4]);
    let panic = out.end().and_then(StageEnd::panic).expect("the panic");
    assert_eq!((panic.name().as_ref(), panic.message()), ("picky", "six"));
}

#[tokio::test(start_paused = true)]
async fn items_left_in_buffers_when_the_consumer_leaves_are_dropped_exactly_once() {
    let baseline = alive_tasks();
    let made = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicUsize::new(0));
    let p = Pipeline::new(CancellationToken::new()).with_capacity(4);
    let (m, d) = (Arc::clone(&made), Arc::clone(&dropped));
    let mut out = p
        .iter((0..1_000).map(move |_| {
            m.fetch_add(1, Ordering::SeqCst);
            Counted(Arc::clone(&d))
        }))
        .spawn_map(&p, |item| async move { item })
        .spawn_filter(&p, |_| true);
    // Every buffer fills: the consumer's own, the queues, the items a stage took.
    eventually("the last output fills", || out.len() == 4).await;
    drop(out.next().await);
    drop(out);
    assert_no_leaked_tasks(baseline).await;
    let made = made.load(Ordering::SeqCst);
    assert!(made > 4, "made {made}");
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        made,
        "every item dropped once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stage_reading_an_adapter_over_a_stage_keeps_order_and_every_item() {
    // The input is not a `Stage` (a `map` over one): the stage takes what is ready one
    // `poll_next` at a time, the other input path.
    let p = Pipeline::new(CancellationToken::new()).with_capacity(5);
    let got: Vec<u64> = p
        .iter(0..1_000_u64)
        .map(|n| n + 1)
        .spawn_map(&p, |n| async move { n * 2 })
        .spawn_filter(&p, |n| n % 3 != 0)
        .collect()
        .await;
    let expected: Vec<u64> = (0..1_000_u64)
        .map(|n| (n + 1) * 2)
        .filter(|n| n % 3 != 0)
        .collect();
    assert_eq!(got, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_on_two_threads_hand_over_every_item_in_order_at_every_capacity() {
    for capacity in [1, 2, 3, 7, 64] {
        let p = Pipeline::new(CancellationToken::new()).with_capacity(capacity);
        let got: Vec<u64> = p
            .iter(0..20_000_u64)
            .spawn_map(&p, |n| async move { n + 1 })
            .spawn_filter(&p, |n| n % 5 != 0)
            .spawn_map(&p, |n| async move {
                if n % 1_000 == 0 {
                    tokio::task::yield_now().await;
                }
                n
            })
            .collect()
            .await;
        let expected: Vec<u64> = (1..=20_000_u64).filter(|n| n % 5 != 0).collect();
        assert_eq!(got, expected, "capacity {capacity}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_step_that_never_waits_hands_each_item_to_a_reader_that_waits() {
    // Item 1's step blocks its thread until the reader has item 0: a stage that held its
    // finished items to the end of the turn would never hand item 0 on.
    let (seen_tx, seen_rx) = std::sync::mpsc::channel::<()>();
    let seen_rx = std::sync::Mutex::new(seen_rx);
    // The three items come in one message, so the source pushes them in one go and the map
    // takes all three in one turn.
    let (feed, feed_rx) = futures::channel::mpsc::unbounded::<Vec<u32>>();
    let p = Pipeline::new(CancellationToken::new()).with_capacity(8);
    let source = p.stream(feed_rx.flat_map(futures::stream::iter));
    let mut out = source.spawn_map(&p, move |n| {
        if n == 1 {
            let seen = seen_rx
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(10));
            assert!(seen.is_ok(), "item 0 was held back while item 1 ran");
        }
        std::future::ready(n)
    });
    // The reader waits first (nothing was sent), then the three items arrive together.
    assert!(futures::poll!(out.next()).is_pending());
    feed.unbounded_send(vec![0, 1, 2]).unwrap();
    assert_eq!(out.next().await, Some(0));
    seen_tx.send(()).unwrap();
    drop(feed);
    assert_eq!(out.collect::<Vec<_>>().await, [1, 2]);
}

/// A stream that is always ready, and panics when dropped.
struct PanicsWhenDropped;

impl futures::Stream for PanicsWhenDropped {
    type Item = u8;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<u8>> {
        std::task::Poll::Ready(Some(1))
    }
}

impl Drop for PanicsWhenDropped {
    fn drop(&mut self) {
        panic!("input dropped");
    }
}

#[tokio::test(start_paused = true)]
async fn a_panic_dropping_the_input_is_the_stage_panic_reported_before_the_end() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let p = Pipeline::new(token.clone()).with_capacity(2);
    let mut out = p.named("src").stream(PanicsWhenDropped);
    eventually("the source fills its output", || out.len() == 2).await;
    token.cancel();
    assert_eq!((&mut out).collect::<Vec<_>>().await, [1, 1]);
    let panic = out
        .end()
        .and_then(StageEnd::panic)
        .expect("reported, not just logged");
    assert_eq!(
        (panic.name().as_ref(), panic.message()),
        ("src", "input dropped")
    );
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn a_step_panic_with_an_input_whose_drop_panics_too_is_reported_not_an_abort() {
    let baseline = alive_tasks();
    let p = Pipeline::new(CancellationToken::new()).with_capacity(4);
    let input = futures::stream::iter([0_u8, 1, 2]).chain(PanicsWhenDropped);
    let mut out = input.spawn_map(&p.named("mapper"), |n| async move {
        assert!(n != 1, "step");
        n
    });
    assert_eq!((&mut out).collect::<Vec<_>>().await, [0]);
    assert_stage_panicked(&out, "mapper", "step");
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn a_cancel_seen_before_a_waiting_step_is_polled_again_wins_over_its_output() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let p = Pipeline::new(token.clone());
    let gate = Arc::new(Semaphore::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let mut out = {
        let (gate, started, finished) = (gate.clone(), started.clone(), finished.clone());
        p.iter(0..1_u32).spawn_map(&p.named("gated"), move |n| {
            let (gate, started, finished) = (gate.clone(), started.clone(), finished.clone());
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                let _permit = gate.acquire().await.expect("never closed");
                finished.fetch_add(1, Ordering::SeqCst);
                n
            }
        })
    };
    eventually("the step waits at its gate", || {
        started.load(Ordering::SeqCst) == 1
    })
    .await;
    // Both in the same instant: the stage's task runs once, after both wake-ups.
    token.cancel();
    gate.add_permits(1);
    assert_eq!((&mut out).collect::<Vec<_>>().await, []);
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "the step went on past its gate after the cancel was seen"
    );
    assert!(matches!(out.end(), Some(StageEnd::Cancelled)));
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn a_step_panic_with_a_step_whose_drop_panics_too_is_reported_not_an_abort() {
    let baseline = alive_tasks();
    let p = Pipeline::new(CancellationToken::new()).with_capacity(4);
    let captured = PanicsWhenDropped;
    let mut out = p.iter(0..3_u8).spawn_map(&p.named("mapper"), move |n| {
        let _captured = &captured;
        async move {
            assert!(n != 1, "step");
            n
        }
    });
    assert_eq!((&mut out).collect::<Vec<_>>().await, [0]);
    assert_stage_panicked(&out, "mapper", "step");
    assert_no_leaked_tasks(baseline).await;
}

/// A step's future that is ready at once and, when `bomb` is set, panics when dropped.
struct ReadyThenPanicsWhenDropped {
    value: u8,
    bomb: bool,
}

impl std::future::Future for ReadyThenPanicsWhenDropped {
    type Output = u8;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<u8> {
        std::task::Poll::Ready(self.value)
    }
}

impl Drop for ReadyThenPanicsWhenDropped {
    fn drop(&mut self) {
        assert!(!self.bomb, "future dropped");
    }
}

#[tokio::test(start_paused = true)]
async fn an_output_whose_finished_future_panics_when_dropped_is_still_handed_on() {
    let baseline = alive_tasks();
    let p = Pipeline::new(CancellationToken::new()).with_capacity(4);
    let mut out = p
        .iter(0..3_u8)
        .spawn_map(&p.named("mapper"), |n| ReadyThenPanicsWhenDropped {
            value: n,
            bomb: n == 1,
        });
    assert_eq!((&mut out).collect::<Vec<_>>().await, [0, 1]);
    assert_stage_panicked(&out, "mapper", "future dropped");
    assert_no_leaked_tasks(baseline).await;
}

/// Panics when dropped if it holds 1.
struct PanicsWhenDroppedAt1(u8);

impl Drop for PanicsWhenDroppedAt1 {
    fn drop(&mut self) {
        assert!(self.0 != 1, "item dropped");
    }
}

#[tokio::test(start_paused = true)]
async fn a_filter_whose_predicate_panics_on_an_item_whose_drop_panics_is_reported_not_an_abort() {
    let baseline = alive_tasks();
    let p = Pipeline::new(CancellationToken::new()).with_capacity(4);
    let input = futures::stream::iter((0..3_u8).map(PanicsWhenDroppedAt1));
    let mut out = input.spawn_filter(&p.named("filter"), |item| {
        assert!(item.0 != 1, "predicate");
        true
    });
    let kept: Vec<u8> = (&mut out).map(|item| item.0).collect().await;
    assert_eq!(kept, [0]);
    let panic = assert_stage_panicked(&out, "filter", "predicate");
    assert!(
        panic
            .location()
            .is_some_and(|at| at.contains("tests/it/batches.rs")),
        "the predicate's panic keeps its site through the item's Drop: {:?}",
        panic.location()
    );
    assert_no_leaked_tasks(baseline).await;
}
