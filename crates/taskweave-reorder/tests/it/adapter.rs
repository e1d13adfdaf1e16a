//! The `reorder` stream adapter.

use futures::{Stream, StreamExt};
use proptest::prelude::*;
use taskweave_reorder::{PushError, ReorderError, reorder};
use tokio_util::sync::CancellationToken;

fn run<T: Send + 'static>(items: Vec<(u64, T)>, window: usize) -> Vec<Result<T, ReorderError<T>>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(
        reorder(
            CancellationToken::new(),
            futures::stream::iter(items),
            window,
        )
        .collect(),
    )
}

#[test]
fn a_duplicate_is_yielded_as_an_error_with_its_value_and_the_rest_goes_on() {
    let out = run(vec![(1, "b"), (0, "a"), (1, "dup"), (2, "c")], 4);
    assert_eq!(out.len(), 4);
    assert_eq!(out[0], Ok("a"));
    assert_eq!(out[1], Ok("b"));
    match &out[2] {
        Err(ReorderError::Refused(PushError::Duplicate { index: 1, value })) => {
            assert_eq!(*value, "dup");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(out[3], Ok("c"));
}

#[test]
fn an_index_too_far_ahead_is_refused_instead_of_hanging_or_growing() {
    let out = run(vec![(5, 'f'), (0, 'a'), (1, 'b')], 2);
    assert!(matches!(
        &out[0],
        Err(ReorderError::Refused(PushError::BeyondWindow {
            index: 5,
            next: 0,
            value: 'f'
        }))
    ));
    assert_eq!(out[1..], [Ok('a'), Ok('b')]);
}

#[test]
fn gaps_at_the_end_are_reported_once_then_the_rest_follows_in_order() {
    let out = run(vec![(3, 'd'), (0, 'a'), (5, 'f')], 8);
    assert_eq!(out[0], Ok('a'));
    match &out[1] {
        Err(ReorderError::Missing(missing)) => {
            assert_eq!(missing.indices().collect::<Vec<_>>(), [1, 2, 4])
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(out[2..], [Ok('d'), Ok('f')], "nothing accepted is lost");
}

#[tokio::test]
async fn cancel_ends_the_stream_at_once() {
    let token = CancellationToken::new();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(u64, u8)>();
    let input =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) })
            .boxed();
    let mut out = reorder(token.clone(), input, 4);
    tx.send((1, 1)).unwrap();
    let mut next = tokio_test::task::spawn(out.next());
    tokio_test::assert_pending!(next.poll(), "index 0 is missing");
    token.cancel();
    assert!(next.is_woken(), "the cancel wakes the consumer");
    assert_eq!(tokio_test::assert_ready!(next.poll()), None);
    drop(next);
    assert!(futures::stream::FusedStream::is_terminated(&out));
    assert!(out.was_cancelled());
    assert_eq!(out.buffer().len(), 1, "index 1 is left in the buffer");
}

proptest! {
    /// Sliding permutations: index i arrives at position i + r, r < window, so each one
    /// fits the window when it comes (sorting by that key).
    #[test]
    fn permutations_within_the_window_come_out_exactly_in_order(
        shifts in proptest::collection::vec(0_u64..8, 0..200),
    ) {
        let mut items: Vec<(u64, u64)> = (0..shifts.len() as u64).map(|i| (i, i)).collect();
        items.sort_by_key(|&(i, _)| i + shifts[i as usize]);
        let out: Vec<u64> = run(items, 8).into_iter().map(Result::unwrap).collect();
        prop_assert_eq!(out, (0..shifts.len() as u64).collect::<Vec<_>>());
    }
}

// Issue 20: taking the input back hands over the buffer too, with what it holds.
#[tokio::test]
async fn into_inner_hands_back_the_input_and_the_buffered_values() {
    let input = futures::stream::iter([(1_u64, "b"), (2, "c"), (0, "a"), (4, "e")]);
    let mut ordered = reorder(CancellationToken::new(), input, 8);
    assert_eq!(ordered.get_ref().size_hint(), (4, Some(4)));
    assert_eq!(ordered.next().await.unwrap().unwrap(), "a");
    assert_eq!(ordered.next().await.unwrap().unwrap(), "b");
    let (mut rest, mut buffer) = ordered.into_inner();
    // "c" was read and buffered; "e" is still in the input.
    assert_eq!(buffer.pop(), Some("c"));
    assert_eq!(rest.next().await, Some((4, "e")));
}
