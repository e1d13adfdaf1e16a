//! `reorder_channel`: producers held back by the window, values out in order.

use std::time::Duration;

use futures::StreamExt;
use proptest::prelude::*;
use taskweave_reorder::{SendError, reorder_channel};
use tokio_test::{assert_pending, assert_ready, task};

#[tokio::test]
async fn a_send_beyond_the_window_waits_until_the_window_moves_on() {
    let (tx, mut rx) = reorder_channel::<char>(2);
    tx.send(1, 'b').await.unwrap();
    let mut far = task::spawn(tx.send(2, 'c'));
    assert_pending!(far.poll(), "2 is beyond 0 + 2: held back");
    tx.send(0, 'a').await.unwrap();
    assert_pending!(far.poll());
    assert_eq!(rx.next().await, Some(Ok('a')));
    assert!(far.is_woken(), "taking 0 out moves the window");
    assert_ready!(far.poll()).unwrap();
    assert_eq!(rx.waiting(), 2);
    drop(far);
    drop(tx);
    let rest: Vec<char> = rx.map(Result::unwrap).collect().await;
    assert_eq!(rest, ['b', 'c']);
}

#[tokio::test]
async fn duplicates_and_a_dropped_receiver_hand_the_value_back() {
    let (tx, rx) = reorder_channel::<&str>(4);
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
    let (tx, rx) = reorder_channel::<u8>(8);
    for index in [0, 2, 3, 6] {
        tx.send(index, index as u8).await.unwrap();
    }
    drop(tx);
    let out: Vec<_> = rx.collect().await;
    assert_eq!(out[0], Ok(0));
    assert_eq!(out[1].as_ref().unwrap_err().indices(), [1, 4, 5]);
    assert_eq!(out[2..], [Ok(2), Ok(3), Ok(6)]);
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
                let tx = tx.clone();
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
