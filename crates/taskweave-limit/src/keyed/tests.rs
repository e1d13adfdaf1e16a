//! `make_room`: which buckets a full shard drops, and how many.

use proptest::prelude::*;

use super::{Bucket, Shard, make_room};

const NOW: u64 = 1_000_000;

/// The hash the tests give key `key` (any function of the key will do for `make_room`).
fn hash(key: usize) -> u64 {
    key as u64
}

/// A shard with a bucket per theoretical arrival time, keyed by its position.
fn shard(tats: &[u64]) -> Shard<usize> {
    let mut shard = Shard::new();
    for (key, &tat) in tats.iter().enumerate() {
        let bucket = Bucket {
            tat,
            last_due: 0,
            born: key as u64,
        };
        shard.insert_unique(hash(key), (key, bucket), |(key, _)| hash(*key));
    }
    shard
}

fn kept_tats(shard: &Shard<usize>) -> Vec<u64> {
    let mut tats: Vec<u64> = shard.iter().map(|(_, bucket)| bucket.tat).collect();
    tats.sort_unstable();
    tats
}

/// The times of the buckets a full shard of `capacity` with these times keeps, sorted.
fn kept_after_making_room(tats: &[u64], capacity: usize) -> Vec<u64> {
    let mut shard = shard(tats);
    make_room(&mut shard, NOW, capacity);
    kept_tats(&shard)
}

/// The times `NOW + first ..= NOW + last`.
fn ahead(first: u64, last: u64) -> Vec<u64> {
    (NOW + first..=NOW + last).collect()
}

#[test]
fn a_shard_of_draining_buckets_drops_a_sixteenth_the_closest_to_full() {
    let tats: Vec<u64> = ahead(1, 64).into_iter().rev().collect();
    assert_eq!(kept_after_making_room(&tats, 64), ahead(5, 64));
}

#[test]
fn buckets_equally_full_go_in_the_number_needed_and_no_more() {
    assert_eq!(kept_after_making_room(&[NOW + 10; 64], 64).len(), 60);
    // Two below the tie, then two of the 62 tied.
    let mut tats = vec![NOW + 10; 62];
    tats.extend([NOW + 1, NOW + 2]);
    assert_eq!(kept_after_making_room(&tats, 64), vec![NOW + 10; 60]);
}

#[test]
fn full_buckets_go_first_and_spare_the_draining_ones_when_they_free_enough() {
    let mut tats = vec![NOW; 5];
    tats.extend([NOW - 1, 0, 3, 4, 7]);
    tats.extend(ahead(1, 54));
    assert_eq!(kept_after_making_room(&tats, 64), ahead(1, 54));
}

#[test]
fn too_few_full_buckets_are_topped_up_with_the_closest_to_full() {
    let mut tats = vec![NOW, NOW - 3];
    tats.extend(ahead(1, 62));
    assert_eq!(kept_after_making_room(&tats, 64), ahead(3, 62));
}

#[test]
fn a_shard_smaller_than_thirty_two_frees_one_slot() {
    for capacity in 1..32 {
        let last = capacity as u64;
        assert_eq!(
            kept_after_making_room(&ahead(1, last), capacity),
            ahead(2, last),
            "capacity {capacity}"
        );
    }
}

proptest! {
    /// Whatever the times: the full buckets go, the shard ends with room for at least a
    /// sixteenth of its capacity (one slot at least) and no fewer buckets than that needs, and
    /// no draining bucket that went was further from full than one that stayed. Few full
    /// buckets (up to a sixteenth and two more) and draining times from a narrow range, so
    /// that several draining buckets must go and ties among them are common.
    #[test]
    fn room_is_made_from_the_buckets_closest_to_full(
        capacity in 1_usize..300,
        full in 0_usize..40,
        ahead in prop::collection::vec(1_u64..8, 300),
        behind in prop::collection::vec(0_u64..5, 40),
    ) {
        let full = full.min(capacity / 16 + 2).min(capacity);
        let mut tats: Vec<u64> = behind[..full].iter().map(|&back| NOW - back).collect();
        tats.extend(ahead[..capacity - full].iter().map(|&ahead| NOW + ahead));
        let mut shard = shard(&tats);
        make_room(&mut shard, NOW, capacity);
        let keep = capacity - (capacity / 16).max(1);
        let draining = capacity - full;
        prop_assert_eq!(shard.len(), draining.min(keep));
        prop_assert!(shard.iter().all(|(_, bucket)| bucket.tat > NOW));
        let furthest_gone = (0..capacity)
            .filter(|&key| shard.find(hash(key), |(other, _)| *other == key).is_none() && tats[key] > NOW)
            .map(|key| tats[key])
            .max();
        let closest_kept = shard.iter().map(|(_, bucket)| bucket.tat).min();
        if let (Some(gone), Some(kept)) = (furthest_gone, closest_kept) {
            prop_assert!(gone <= kept, "dropped {} but kept {}", gone, kept);
        }
    }
}
