//! `merge`: fair, every item once, ends when all inputs end or on cancel.

use std::time::Duration;

use futures::stream::FusedStream;
use futures::{Stream, StreamExt};
use proptest::prelude::*;
use taskweave_fan::merge;
use tokio_test::{assert_pending, assert_ready};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_busy_input_never_starves_the_others() {
    // Three endless, always-ready inputs: round-robin means each gets every third turn.
    let inputs = [0_u8, 1, 2].map(futures::stream::repeat);
    let first: Vec<u8> = merge(CancellationToken::new(), inputs)
        .take(9)
        .collect()
        .await;
    assert_eq!(first, [0, 1, 2, 0, 1, 2, 0, 1, 2]);
}

#[tokio::test]
async fn ended_inputs_leave_the_rotation_and_the_merge_ends_with_the_last() {
    let inputs = [vec![1, 1, 1], vec![2], vec![]].map(futures::stream::iter);
    let mut merged = merge(CancellationToken::new(), inputs);
    assert_eq!(merged.remaining(), 3);
    let items: Vec<i32> = (&mut merged).collect().await;
    assert_eq!(items, [1, 2, 1, 1]);
    assert!(merged.is_terminated());
    assert_eq!(merged.remaining(), 0);
    assert_eq!(merged.next().await, None);
}

#[tokio::test]
async fn no_inputs_is_an_empty_stream() {
    let inputs: Vec<futures::stream::Iter<std::vec::IntoIter<u8>>> = Vec::new();
    assert_eq!(merge(CancellationToken::new(), inputs).next().await, None);
}

#[tokio::test]
async fn cancelling_the_token_ends_it_and_drops_the_inputs() {
    let (tx, rx) = tokio::sync::mpsc::channel::<u8>(4);
    let token = CancellationToken::new();
    let mut merged = merge(
        token.clone(),
        [tokio_stream::wrappers::ReceiverStream::new(rx)],
    );
    let mut next = tokio_test::task::spawn(merged.next());
    assert_pending!(next.poll());
    token.cancel();
    assert!(
        next.is_woken(),
        "a pending consumer is woken by the cancellation"
    );
    assert_eq!(assert_ready!(next.poll()), None);
    drop(next);
    assert!(tx.is_closed(), "the inputs are dropped at once");
}

#[tokio::test]
async fn an_input_that_ends_before_the_turn_does_not_cost_the_next_one_its_turn() {
    // A yields, so the turn goes to B. In the next poll B and C have nothing and A ends:
    // it leaves the rotation, and the turn must still be B's, not C's.
    the_turn_is_b_after_a_ends(0, "a").await;
}

#[tokio::test]
async fn the_first_input_ending_after_the_last_one_yielded_keeps_the_turn_on_the_second() {
    // C (the last) yields, so the turn wraps to A. In the next poll A ends and B and C have
    // nothing: the turn must be B's (the one after A), not C's again.
    the_turn_is_b_after_a_ends(2, "c").await;
}

/// Merges three inputs A, B and C; input `first` yields `item`, then A ends in a poll in
/// which B and C have nothing; then B and C both have an item, and B's must come first.
async fn the_turn_is_b_after_a_ends(first: usize, item: &'static str) {
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..3)
        .map(|_| tokio::sync::mpsc::unbounded_channel::<&str>())
        .unzip();
    let [a_tx, b_tx, c_tx] = <[_; 3]>::try_from(senders).unwrap();
    let mut merged = merge(
        CancellationToken::new(),
        receivers
            .into_iter()
            .map(tokio_stream::wrappers::UnboundedReceiverStream::new),
    );
    [&a_tx, &b_tx, &c_tx][first].send(item).unwrap();
    assert_eq!(merged.next().await, Some(item));
    drop(a_tx);
    {
        let mut next = tokio_test::task::spawn(merged.next());
        assert_pending!(next.poll());
    }
    c_tx.send("c").unwrap();
    b_tx.send("b").unwrap();
    assert_eq!(merged.next().await, Some("b"), "B's turn comes first");
    assert_eq!(merged.next().await, Some("c"));
}

/// `count` items named `name`, one every `period_ms`.
fn ticker(name: &'static str, period_ms: u64, count: u32) -> impl Stream<Item = &'static str> {
    futures::stream::unfold(0_u32, move |n| async move {
        tokio::time::sleep(Duration::from_millis(period_ms)).await;
        (n < count).then_some((name, n + 1))
    })
}

#[tokio::test(start_paused = true)]
async fn items_arrive_as_their_inputs_produce_them() {
    let inputs = [
        Box::pin(ticker("slow", 100, 2)),
        Box::pin(ticker("fast", 30, 4)),
    ];
    let items: Vec<&str> = merge(CancellationToken::new(), inputs).collect().await;
    // fast at 30, 60, 90, 120; slow at 100, 200.
    assert_eq!(items, ["fast", "fast", "fast", "slow", "fast", "slow"]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    // Every item of every input comes out exactly once, and each input's items keep their
    // order.
    #[test]
    fn every_item_comes_out_once_in_input_order(
        inputs in proptest::collection::vec(proptest::collection::vec(0_u32..1000, 0..20), 0..8),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let tagged: Vec<Vec<(usize, usize)>> = inputs
            .iter()
            .enumerate()
            .map(|(input, items)| (0..items.len()).map(|position| (input, position)).collect())
            .collect();
        let streams = tagged.clone().into_iter().map(futures::stream::iter);
        let merged: Vec<(usize, usize)> =
            runtime.block_on(merge(CancellationToken::new(), streams).collect());
        prop_assert_eq!(merged.len(), tagged.iter().map(Vec::len).sum::<usize>());
        for (input, items) in tagged.iter().enumerate() {
            let seen: Vec<(usize, usize)> =
                merged.iter().copied().filter(|(from, _)| *from == input).collect();
            prop_assert_eq!(&seen, items);
        }
    }
}
