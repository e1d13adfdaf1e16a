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
    assert_eq!(buffer.missing().indices().collect::<Vec<_>>(), [11, 13, 14]);
    let missing = buffer.finish().unwrap_err();
    assert_eq!(missing.indices().collect::<Vec<_>>(), [11, 13, 14]);
    assert_eq!(missing.ranges(), [11..=11, 13..=14]);
    assert_eq!(missing.count(), 3);
    assert_eq!(missing.to_string(), "3 indices never arrived: 11, 13, 14");
    assert_eq!(buffer.skip(), None, "11 never came");
    assert_eq!(buffer.pop(), Some(12));
}

#[test]
fn the_top_of_the_index_range_pops_without_overflow() {
    let mut buffer = ReorderBuffer::starting_at(u64::MAX - 1, 4);
    buffer.push(u64::MAX, 'b').unwrap();
    buffer.push(u64::MAX - 1, 'a').unwrap();
    assert_eq!(buffer.pop(), Some('a'));
    assert!(!buffer.is_exhausted());
    assert_eq!(buffer.pop(), Some('b'));
    assert!(buffer.is_exhausted(), "no index is left after u64::MAX");
    assert_eq!(buffer.next_index(), u64::MAX);
    assert_eq!(buffer.pop(), None);
    assert_eq!(buffer.skip(), None);
    assert!(!buffer.fits(u64::MAX));
    assert!(matches!(
        buffer.push(u64::MAX, 'c'),
        Err(PushError::Duplicate {
            index: u64::MAX,
            ..
        })
    ));
    assert!(buffer.finish().is_ok());
}

#[test]
fn skipping_u64_max_exhausts_the_buffer() {
    let mut buffer = ReorderBuffer::<u8>::starting_at(u64::MAX, 1);
    assert_eq!(buffer.skip(), None);
    assert!(buffer.is_exhausted());
    assert!(buffer.push(u64::MAX, 1).is_err());
}

#[test]
fn a_huge_window_with_a_far_index_holds_one_entry_not_a_slot_per_index() {
    let mut buffer = ReorderBuffer::new(usize::MAX);
    buffer.push(u64::MAX - 1, "far").unwrap();
    buffer.push(1 << 40, "middle").unwrap();
    buffer.push(1, "near").unwrap();
    assert_eq!(buffer.len(), 3);
    assert!(matches!(
        buffer.push(1 << 40, "again"),
        Err(PushError::Duplicate { .. })
    ));
    // The gaps are ranges, however wide.
    let missing = buffer.missing();
    assert_eq!(
        missing.ranges(),
        [0..=0, 2..=(1 << 40) - 1, (1 << 40) + 1..=u64::MAX - 2]
    );
    // Every index below u64::MAX - 1 but the three buffered.
    assert_eq!(missing.count(), u64::MAX - 3);
    let text = missing.to_string();
    let expected = format!("{} indices never arrived: 0, 2, 3, 4,", u64::MAX - 3);
    assert!(text.starts_with(&expected), "{text}");
    assert_eq!(buffer.skip(), None, "0 never came");
    assert_eq!(buffer.pop(), Some("near"));
    assert_eq!(buffer.pop(), None);
    // The far values come out once their turn comes.
    let mut buffer = ReorderBuffer::starting_at(u64::MAX - 2, usize::MAX);
    buffer.push(u64::MAX, 'z').unwrap();
    buffer.push(u64::MAX - 2, 'x').unwrap();
    buffer.push(u64::MAX - 1, 'y').unwrap();
    let out: Vec<char> = std::iter::from_fn(|| buffer.pop()).collect();
    assert_eq!(out, ['x', 'y', 'z']);
    assert!(buffer.is_exhausted());
}

#[test]
#[should_panic(expected = "ReorderBuffer: window must be greater than zero")]
fn a_zero_window_panics() {
    let _ = ReorderBuffer::<u8>::new(0);
}

proptest! {
    /// Indices spread far apart (so that some sit in the far map and some in the ring),
    /// pushed in any order with pops and skips in between: the buffer behaves as a plain
    /// ordered map of the indices at or after `next`.
    #[test]
    fn far_and_near_indices_behave_as_an_ordered_map(
        offsets in proptest::collection::vec(0_u64..5_000, 1..60),
        ops in proptest::collection::vec(0_u8..4, 1..200),
    ) {
        let mut buffer = ReorderBuffer::new(usize::MAX);
        let mut model = std::collections::BTreeMap::new();
        let mut next = 0_u64;
        let mut pending: Vec<u64> = offsets.iter().map(|offset| offset * offset).collect();
        for op in ops {
            match op {
                0 | 1 => {
                    if let Some(index) = pending.pop() {
                        let expect_ok = index >= next && !model.contains_key(&index);
                        prop_assert_eq!(buffer.push(index, index).is_ok(), expect_ok);
                        if expect_ok {
                            model.insert(index, index);
                        }
                    }
                }
                2 => {
                    let expected = model.remove(&next);
                    prop_assert_eq!(buffer.pop(), expected);
                    if expected.is_some() {
                        next += 1;
                    }
                }
                _ => {
                    prop_assert_eq!(buffer.skip(), model.remove(&next));
                    next += 1;
                }
            }
            prop_assert_eq!(buffer.next_index(), next);
            prop_assert_eq!(buffer.len(), model.len());
            let highest = model.keys().next_back().copied();
            let missing: u64 = highest.map_or(0, |highest| highest - next + 1 - model.len() as u64);
            prop_assert_eq!(buffer.missing().count(), missing);
        }
    }

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
