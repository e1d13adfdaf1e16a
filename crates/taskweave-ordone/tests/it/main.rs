//! Integration tests of taskweave-ordone.

use std::time::Duration;

use futures::stream::FusedStream;
use futures::{Stream, StreamExt};
use taskweave_ordone::{OrDone, OrDoneExt, or_done};
use tokio_test::{assert_pending, assert_ready};
use tokio_util::sync::CancellationToken;

fn send_sync_unpin<T: Send + Sync + Unpin>() {}

#[test]
fn or_done_is_send_sync_and_unpin_over_such_a_stream() {
    send_sync_unpin::<OrDone<futures::stream::Iter<std::vec::IntoIter<u8>>>>();
}

#[tokio::test]
async fn a_pending_consumer_is_woken_by_the_cancellation() {
    let (_tx, rx) = tokio::sync::mpsc::channel::<u8>(1);
    let token = CancellationToken::new();
    let mut stream = tokio_stream::wrappers::ReceiverStream::new(rx).or_done(token.clone());
    let mut next = tokio_test::task::spawn(stream.next());
    assert_pending!(next.poll());
    token.cancel();
    assert!(next.is_woken());
    assert_eq!(assert_ready!(next.poll()), None);
    drop(next);
    assert!(stream.is_terminated());
}

#[tokio::test]
async fn cancellation_wins_over_a_ready_item() {
    let token = CancellationToken::new();
    let mut stream = futures::stream::iter(0..10).or_done(token.clone());
    assert_eq!(stream.next().await, Some(0));
    token.cancel();
    assert_eq!(stream.next().await, None);
    assert_eq!(stream.next().await, None, "fused");
}

#[tokio::test]
async fn the_inputs_end_ends_it_and_it_stays_ended() {
    let mut stream = or_done(CancellationToken::new(), futures::stream::iter([1, 2]));
    assert_eq!(stream.size_hint(), (0, Some(2)));
    assert_eq!(stream.next().await, Some(1));
    assert_eq!(stream.next().await, Some(2));
    assert_eq!(stream.next().await, None);
    assert!(stream.is_terminated());
    assert_eq!(stream.size_hint(), (0, Some(0)));
}

#[tokio::test(start_paused = true)]
async fn a_consumer_loop_needs_no_select() {
    let token = CancellationToken::new();
    let canceller = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(250)).await;
        canceller.cancel();
    });
    let ticks = futures::stream::unfold(0_u32, |n| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        Some((n, n + 1))
    });
    let seen: Vec<u32> = ticks.or_done(token).collect().await;
    assert_eq!(seen, [0, 1], "ticks at 100 and 200 ms; cancelled at 250");
}

#[tokio::test]
async fn dropping_it_drops_the_input() {
    let (tx, rx) = tokio::sync::mpsc::channel::<u8>(1);
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx).or_done(CancellationToken::new());
    drop(stream);
    assert!(tx.is_closed(), "the receiver went with the adapter");
}

// Issue 20: the input is reachable and can be taken back, as with futures' adapters.
#[tokio::test]
async fn the_input_can_be_inspected_and_taken_back() {
    let token = CancellationToken::new();
    let mut stream = or_done(token.clone(), futures::stream::iter([1, 2, 3]));
    assert_eq!(stream.get_ref().size_hint(), (3, Some(3)));
    assert_eq!(stream.next().await, Some(1));
    assert_eq!(stream.get_mut().next().await, Some(2));
    let mut pinned = std::pin::pin!(stream);
    assert_eq!(pinned.as_mut().get_pin_mut().size_hint(), (1, Some(1)));
    assert_eq!(pinned.next().await, Some(3));
    let taken_back = or_done(token.clone(), futures::stream::iter([4, 5])).into_inner();
    assert_eq!(taken_back.collect::<Vec<_>>().await, [4, 5]);
    token.cancel();
    assert_eq!(pinned.next().await, None, "cancelled");
}
