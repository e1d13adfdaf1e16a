//! `reorder_channel`: producers held back by the window, values out in order.

use std::time::Duration;

use futures::StreamExt;
use proptest::prelude::*;
use taskweave_reorder::{SendError, reorder_channel};
use tokio_test::{assert_pending, assert_ready, task};

#[tokio::test]
async fn a_send_beyond_the_window_waits_until_the_window_moves_on() {
    let (mut tx, mut rx) = reorder_channel::<char>(2);
    let mut other = tx.clone();
    tx.send(1, 'b').await.unwrap();
    let mut far = task::spawn(other.send(2, 'c'));
    assert_pending!(far.poll(), "2 is beyond 0 + 2: held back");
    tx.send(0, 'a').await.unwrap();
    assert_pending!(far.poll());
    assert_eq!(rx.next().await, Some(Ok('a')));
    assert!(far.is_woken(), "taking 0 out moves the window");
    assert_ready!(far.poll()).unwrap();
    assert_eq!(rx.waiting(), 2);
    drop(far);
    drop(tx);
    drop(other);
    let rest: Vec<char> = rx.map(Result::unwrap).collect().await;
    assert_eq!(rest, ['b', 'c']);
}

#[tokio::test]
async fn duplicates_and_a_dropped_receiver_hand_the_value_back() {
    let (mut tx, rx) = reorder_channel::<&str>(4);
    tx.send(0, "first").await.unwrap();
    let duplicate = tx.send(0, "again").await.unwrap_err();
    assert!(matches!(duplicate, SendError::Duplicate { index: 0, .. }));
    assert_eq!(duplicate.into_inner(), "again");
    let mut waiting = task::spawn(tx.send(9, "far"));
    assert_pending!(waiting.poll());
    drop(rx);
    assert!(waiting.is_woken());
    assert_eq!(assert_ready!(waiting.poll()), Err(SendError::Closed("far")));
}

#[tokio::test]
async fn gaps_left_by_the_producers_are_reported_then_the_rest_follows() {
    let (mut tx, rx) = reorder_channel::<u8>(8);
    for index in [0, 2, 3, 6] {
        tx.send(index, index as u8).await.unwrap();
    }
    drop(tx);
    let out: Vec<_> = rx.collect().await;
    assert_eq!(out[0], Ok(0));
    let missing = out[1].as_ref().unwrap_err();
    assert_eq!(missing.indices().collect::<Vec<_>>(), [1, 4, 5]);
    assert_eq!(out[2..], [Ok(2), Ok(3), Ok(6)]);
}

#[tokio::test]
async fn a_gap_nobody_can_fill_is_reported_when_every_sender_left_is_held_back() {
    // Window 2: the sender of index 5 waits; the only other sender is dropped without
    // sending index 0. Nobody can send 0 any more: the receiver steps over 0..=3 so that 5
    // fits, says so, and goes on.
    let (tx, mut rx) = reorder_channel::<char>(2);
    let other = tx.clone();
    let far = tokio::spawn({
        let mut tx = tx.clone();
        async move { tx.send(5, 'f').await }
    });
    drop(tx);
    tokio::task::yield_now().await;
    drop(other);
    let missing = rx.next().await.unwrap().unwrap_err();
    assert_eq!(missing.ranges(), [0..=3]);
    far.await.unwrap().unwrap();
    // Every sender is gone now: 4 is reported at the end, then 5 follows.
    let rest: Vec<_> = rx.collect().await;
    assert_eq!(rest.len(), 2);
    assert_eq!(rest[0].as_ref().unwrap_err().ranges(), [4..=4]);
    assert_eq!(rest[1], Ok('f'));
}

#[tokio::test]
async fn a_step_over_a_gap_stops_at_the_first_value_that_arrived() {
    let (mut tx, mut rx) = reorder_channel::<char>(3);
    tx.send(2, 'c').await.unwrap();
    let held = tokio::spawn({
        let mut tx = tx.clone();
        async move { tx.send(4, 'e').await }
    });
    drop(tx);
    // 0 and 1 can no longer come; 2 arrived: the skip stops there.
    let missing = rx.next().await.unwrap().unwrap_err();
    assert_eq!(missing.ranges(), [0..=1]);
    assert_eq!(rx.next().await, Some(Ok('c')));
    held.await.unwrap().unwrap();
    // The sender of 4 is gone: 3 is reported at the end, then 4 follows.
    let rest: Vec<_> = rx.collect().await;
    assert_eq!(rest.len(), 2);
    assert_eq!(rest[0].as_ref().unwrap_err().ranges(), [3..=3]);
    assert_eq!(rest[1], Ok('e'));
}

#[tokio::test]
async fn a_sender_that_is_not_held_back_keeps_the_receiver_waiting_for_it() {
    let (mut tx, mut rx) = reorder_channel::<char>(2);
    let mut idle = tx.clone();
    let mut far = task::spawn(tx.send(5, 'f'));
    assert_pending!(far.poll());
    let mut next = task::spawn(rx.next());
    assert_pending!(next.poll(), "`idle` could still send 0");
    // A held-back send that is dropped no longer counts as held back.
    drop(far);
    drop(tx);
    assert_pending!(next.poll(), "`idle` could still send 0");
    idle.send(0, 'a').await.unwrap();
    assert!(next.is_woken());
    assert_eq!(assert_ready!(next.poll()), Some(Ok('a')));
    drop(next);
    let late = idle.send(1, 'b');
    late.await.unwrap();
    drop(idle);
    assert_eq!(rx.next().await, Some(Ok('b')));
    assert_eq!(rx.next().await, None);
}

#[tokio::test]
async fn an_index_stepped_over_and_sent_later_is_a_duplicate() {
    let (mut tx, mut rx) = reorder_channel::<char>(1);
    let mut late = tx.clone();
    let held = tokio::spawn(async move { tx.send(1, 'b').await });
    let mut next = task::spawn(rx.next());
    assert_pending!(next.poll(), "`late` could still send 0");
    // `late` is held back too now: every sender left is, so 0 is stepped over.
    let mut far = task::spawn(late.send(3, 'd'));
    assert_pending!(far.poll());
    while !next.is_woken() {
        tokio::task::yield_now().await;
    }
    let missing = assert_ready!(next.poll()).unwrap().unwrap_err();
    assert_eq!(missing.ranges(), [0..=0]);
    drop(next);
    held.await.unwrap().unwrap();
    assert_eq!(rx.next().await, Some(Ok('b')));
    drop(far);
    assert!(matches!(
        late.send(0, 'a').await,
        Err(SendError::Duplicate { index: 0, .. })
    ));
}

#[tokio::test]
async fn a_send_held_at_an_index_another_sender_filled_is_a_duplicate_not_a_skip() {
    // Window 2. `a` is held back at 2; `b` sends 0, 1 and then 2 itself, all taken out, so
    // the window has passed 2 before `a` retries. With `b` gone, the only sender left is
    // held back, but at an index behind the window: nothing is skipped, and `a` is told its
    // index is a duplicate.
    let (mut a, mut rx) = reorder_channel::<char>(2);
    let mut b = a.clone();
    let mut held = task::spawn(a.send(2, 'x'));
    assert_pending!(held.poll());
    for (index, value) in [(0, 'a'), (1, 'b'), (2, 'c')] {
        b.send(index, value).await.unwrap();
        assert_eq!(rx.next().await, Some(Ok(value)));
    }
    drop(b);
    let mut next = task::spawn(rx.next());
    assert_pending!(next.poll(), "nothing to skip: 2 was delivered");
    assert!(matches!(
        assert_ready!(held.poll()),
        Err(SendError::Duplicate { index: 2, .. })
    ));
    drop(held);
    drop(a);
    assert!(next.is_woken());
    assert_eq!(assert_ready!(next.poll()), None, "no gap, nothing left");
}

proptest! {
    /// One producer task per index, in a random order and with random delays: the values come
    /// out in order, and the buffer never holds more than its window.
    #[test]
    fn concurrent_producers_come_out_in_order_within_the_window(
        delays in proptest::collection::vec(0_u64..20, 0..80),
        window in 1_usize..10,
    ) {
        let runtime = taskweave_testkit::paused_runtime();
        let n = delays.len() as u64;
        let (out, peak) = runtime.block_on(async move {
            let (tx, mut rx) = reorder_channel::<u64>(window);
            for (index, ms) in delays.into_iter().enumerate() {
                let mut tx = tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    tx.send(index as u64, index as u64).await.unwrap();
                });
            }
            drop(tx);
            let mut out = Vec::new();
            let mut peak = 0;
            while let Some(value) = rx.next().await {
                peak = peak.max(rx.waiting() + 1);
                out.push(value.unwrap());
            }
            (out, peak)
        });
        prop_assert_eq!(out, (0..n).collect::<Vec<_>>());
        prop_assert!(peak <= window);
    }
}
