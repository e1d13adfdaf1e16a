//! `make_room`: which buckets a full shard drops, and how many.

use std::collections::HashMap;

use proptest::prelude::*;

use super::{Bucket, make_room};

const NOW: u64 = 1_000_000;

/// A shard with a bucket per theoretical arrival time, keyed by its position.
fn shard(tats: &[u64]) -> HashMap<usize, Bucket> {
    tats.iter()
        .enumerate()
        .map(|(key, &tat)| {
            let bucket = Bucket {
                tat,
                last_due: 0,
                born: key as u64,
            };
            (key, bucket)
        })
        .collect()
}

fn kept_tats(shard: &HashMap<usize, Bucket>) -> Vec<u64> {
    let mut tats: Vec<u64> = shard.values().map(|bucket| bucket.tat).collect();
    tats.sort_unstable();
    tats
}

#[test]
fn a_shard_of_draining_buckets_drops_a_sixteenth_the_closest_to_full() {
    let tats: Vec<u64> = (1..=64).rev().map(|ahead| NOW + ahead).collect();
    let mut shard = shard(&tats);
    make_room(&mut shard, NOW, 64);
    assert_eq!(kept_tats(&shard), (NOW + 5..=NOW + 64).collect::<Vec<_>>());
}

#[test]
fn buckets_equally_full_go_in_the_number_needed_and_no_more() {
    let mut shard = shard(&[NOW + 10; 64]);
    make_room(&mut shard, NOW, 64);
    assert_eq!(shard.len(), 60);
    let mut shard = shard_with_ties();
    make_room(&mut shard, NOW, 64);
    // Two below the tie, then two of the 62 tied.
    assert_eq!(kept_tats(&shard), vec![NOW + 10; 60]);
}

fn shard_with_ties() -> HashMap<usize, Bucket> {
    let mut tats = vec![NOW + 10; 62];
    tats.extend([NOW + 1, NOW + 2]);
    shard(&tats)
}

#[test]
fn full_buckets_go_first_and_spare_the_draining_ones_when_they_free_enough() {
    let mut tats = vec![NOW; 5];
    tats.extend([NOW - 1, 0, 3, 4, 7]);
    tats.extend((1..=54).map(|ahead| NOW + ahead));
    let mut shard = shard(&tats);
    make_room(&mut shard, NOW, 64);
    assert_eq!(kept_tats(&shard), (NOW + 1..=NOW + 54).collect::<Vec<_>>());
}

#[test]
fn too_few_full_buckets_are_topped_up_with_the_closest_to_full() {
    let mut tats = vec![NOW, NOW - 3];
    tats.extend((1..=62).map(|ahead| NOW + ahead));
    let mut shard = shard(&tats);
    make_room(&mut shard, NOW, 64);
    assert_eq!(kept_tats(&shard), (NOW + 3..=NOW + 62).collect::<Vec<_>>());
}

#[test]
fn a_shard_smaller_than_sixteen_frees_one_slot() {
    for capacity in 1..16 {
        let tats: Vec<u64> = (1..=capacity as u64).map(|ahead| NOW + ahead).collect();
        let mut shard = shard(&tats);
        make_room(&mut shard, NOW, capacity);
        assert_eq!(
            kept_tats(&shard),
            (NOW + 2..=NOW + capacity as u64).collect::<Vec<_>>(),
            "capacity {capacity}"
        );
    }
}

proptest! {
    /// Whatever the times: the full buckets go, the shard ends with room for at least a
    /// sixteenth of its capacity (one slot at least) and no fewer buckets than that needs, and
    /// no draining bucket that went was further from full than one that stayed.
    #[test]
    fn room_is_made_from_the_buckets_closest_to_full(
        capacity in 1_usize..300,
        offsets in prop::collection::vec(-50_i64..50, 300),
    ) {
        let tats: Vec<u64> = offsets[..capacity]
            .iter()
            .map(|&offset| NOW.checked_add_signed(offset).unwrap())
            .collect();
        let mut shard = shard(&tats);
        make_room(&mut shard, NOW, capacity);
        let keep = capacity - (capacity / 16).max(1);
        let draining = tats.iter().filter(|&&tat| tat > NOW).count();
        prop_assert_eq!(shard.len(), draining.min(keep));
        prop_assert!(shard.values().all(|bucket| bucket.tat > NOW));
        let furthest_gone = (0..capacity)
            .filter(|key| !shard.contains_key(key) && tats[*key] > NOW)
            .map(|key| tats[key])
            .max();
        let closest_kept = shard.values().map(|bucket| bucket.tat).min();
        if let (Some(gone), Some(kept)) = (furthest_gone, closest_kept) {
            prop_assert!(gone <= kept, "dropped {} but kept {}", gone, kept);
        }
    }
}
