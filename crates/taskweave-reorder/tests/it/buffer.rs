//! `ReorderBuffer`: order, window bound, duplicates, gaps.

use proptest::prelude::*;
use taskweave_reorder::{PushError, ReorderBuffer};

#[test]
fn values_come_out_in_index_order_whatever_the_push_order() {
    let mut buffer = ReorderBuffer::new(8);
    for index in [3, 1, 4, 0, 2] {
        buffer.push(index, index * 10).unwrap();
    }
    assert_eq!(buffer.len(), 5);
    let out: Vec<u64> = std::iter::from_fn(|| buffer.pop()).collect();
    assert_eq!(out, [0, 10, 20, 30, 40]);
    assert!(buffer.is_empty());
    assert_eq!(buffer.next_index(), 5);
    assert_eq!(buffer.finish(), Ok(()));
}

#[test]
fn an_index_beyond_the_window_is_handed_back_and_changes_nothing() {
    let mut buffer = ReorderBuffer::new(3);
    buffer.push(1, 'b').unwrap();
    assert!(buffer.fits(2));
    assert!(!buffer.fits(3));
    let refused = buffer.push(3, 'd').unwrap_err();
    assert!(matches!(
        refused,
        PushError::BeyondWindow {
            index: 3,
            next: 0,
            ..
        }
    ));
    assert_eq!(
        refused.to_string(),
        "index 3 is beyond the window (next is 0)"
    );
    assert_eq!(refused.into_inner(), 'd');
    assert_eq!(buffer.len(), 1);
    // Far beyond: no overflow, the same error.
    assert_eq!(buffer.push(u64::MAX, 'z').unwrap_err().index(), u64::MAX);
    // Once the window moves on, the held-back item fits.
    buffer.push(0, 'a').unwrap();
    assert_eq!(buffer.pop(), Some('a'));
    buffer.push(3, 'd').unwrap();
}

#[test]
fn a_duplicate_is_refused_whether_buffered_or_already_taken() {
    let mut buffer = ReorderBuffer::new(4);
    buffer.push(0, "first").unwrap();
    buffer.push(2, "two").unwrap();
    let again = buffer.push(2, "again").unwrap_err();
    assert!(matches!(again, PushError::Duplicate { index: 2, .. }));
    assert_eq!(
        again.to_string(),
        "duplicate index 2 (buffered, taken or skipped already)"
    );
    assert_eq!(buffer.pop(), Some("first"));
    let taken = buffer.push(0, "late").unwrap_err();
    assert_eq!(taken.into_inner(), "late");
    assert_eq!(buffer.len(), 1, "the first push of 2 is kept");
}

#[test]
fn gaps_are_listed_and_can_be_skipped() {
    let mut buffer = ReorderBuffer::starting_at(10, 8);
    for index in [10, 12, 15] {
        buffer.push(index, index).unwrap();
    }
    assert_eq!(buffer.pop(), Some(10));
    assert_eq!(buffer.missing(), [11, 13, 14]);
    let missing = buffer.finish().unwrap_err();
    assert_eq!(missing.indices(), [11, 13, 14]);
    assert_eq!(missing.to_string(), "3 indices never arrived: 11, 13, 14");
    assert_eq!(buffer.skip(), None, "11 never came");
    assert_eq!(buffer.pop(), Some(12));
}

#[test]
#[should_panic(expected = "ReorderBuffer: window must be greater than zero")]
fn a_zero_window_panics() {
    let _ = ReorderBuffer::<u8>::new(0);
}

proptest! {
    /// Producers that hold an item back while it is beyond the window: every index comes
    /// out exactly once, in order, and the buffer never holds more than its window.
    #[test]
    fn held_back_pushes_come_out_in_order_within_the_bound(
        order in Just((0..200_u64).collect::<Vec<_>>()).prop_shuffle(),
        window in 1_usize..16,
    ) {
        let mut buffer = ReorderBuffer::new(window);
        let mut held = Vec::new();
        let mut out = Vec::new();
        for index in order {
            held.push(index);
            // Push whatever fits; keep the rest held back.
            held.retain(|&index| match buffer.push(index, index) {
                Ok(()) => false,
                Err(PushError::BeyondWindow { .. }) => true,
                Err(error) => panic!("unexpected {error}"),
            });
            prop_assert!(buffer.len() <= window);
            while let Some(value) = buffer.pop() {
                out.push(value);
            }
            // Popping may make room for held items.
            loop {
                let before = held.len();
                held.retain(|&index| buffer.push(index, index).is_err());
                while let Some(value) = buffer.pop() {
                    out.push(value);
                }
                if held.len() == before {
                    break;
                }
            }
        }
        prop_assert!(held.is_empty());
        prop_assert_eq!(out, (0..200).collect::<Vec<_>>());
    }
}
