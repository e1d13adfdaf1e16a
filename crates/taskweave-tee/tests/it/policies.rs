//! Lockstep, drop-oldest and disconnect outputs, alone and side by side.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use proptest::prelude::*;
use taskweave_tee::{Policy, TeeOutput, tee, tee_n, tee_with};
use tokio_util::sync::CancellationToken;

fn drain<T: Send + 'static>(output: TeeOutput<T>) -> tokio::task::JoinHandle<Vec<T>> {
    tokio::spawn(output.collect())
}

#[tokio::test(start_paused = true)]
async fn the_slowest_lockstep_consumer_sets_the_pace() {
    let mut outputs = tee_with(
        CancellationToken::new(),
        futures::stream::iter(0..100),
        [Policy::lockstep(2), Policy::lockstep(2)],
    );
    let mut slow = outputs.pop().unwrap();
    let mut fast_output = outputs.pop().unwrap();
    let received = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&received);
    let fast = tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some(v) = fast_output.next().await {
            counter.fetch_add(1, Ordering::SeqCst);
            got.push(v);
        }
        got
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    // The slow one holds 2; the fast one got those 2 and the third, which the tee now holds
    // for the slow one while it waits for room.
    assert_eq!(slow.len(), 2);
    assert_eq!(received.load(Ordering::SeqCst), 3);
    assert_eq!(slow.next().await, Some(0));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        received.load(Ordering::SeqCst),
        4,
        "one value out of the slow one, one more in"
    );
    let mut got = vec![0];
    while let Some(v) = slow.next().await {
        got.push(v);
    }
    assert_eq!(got, (0..100).collect::<Vec<_>>());
    assert_eq!(fast.await.unwrap(), (0..100).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn a_drop_oldest_output_keeps_the_newest_and_counts_what_it_dropped() {
    let mut outputs = tee_with(
        CancellationToken::new(),
        futures::stream::iter(0..50),
        [Policy::lockstep(1), Policy::drop_oldest(3)],
    );
    let lagging = outputs.pop().unwrap();
    let steady = drain(outputs.pop().unwrap());
    assert_eq!(
        steady.await.unwrap(),
        (0..50).collect::<Vec<_>>(),
        "never slowed down"
    );
    assert_eq!(lagging.lagged(), 47);
    assert!(!lagging.is_disconnected());
    assert_eq!(lagging.policy(), Policy::drop_oldest(3));
    assert_eq!(lagging.collect::<Vec<_>>().await, [47, 48, 49]);
}

#[tokio::test(start_paused = true)]
async fn a_laggard_is_disconnected_after_its_bound_and_the_others_go_on() {
    let mut outputs = tee_with(
        CancellationToken::new(),
        futures::stream::iter(0..20),
        [Policy::lockstep(1), Policy::disconnect(4)],
    );
    let mut laggard = outputs.pop().unwrap();
    let steady = drain(outputs.pop().unwrap());
    assert_eq!(steady.await.unwrap(), (0..20).collect::<Vec<_>>());
    assert!(laggard.is_disconnected());
    assert_eq!(laggard.lagged(), 0);
    assert_eq!(
        (&mut laggard).collect::<Vec<_>>().await,
        [0, 1, 2, 3],
        "what it held, then the end"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dropped_output_never_stalls_the_others() {
    let token = CancellationToken::new();
    let mut outputs = tee_n(token, futures::stream::iter(0..1_000), 3);
    // Dropped unread, full of values, while the tee may be waiting on it.
    let third = outputs.pop().unwrap();
    let second = drain(outputs.pop().unwrap());
    let first = drain(outputs.pop().unwrap());
    tokio::time::sleep(Duration::from_millis(1)).await;
    drop(third);
    assert_eq!(first.await.unwrap().len(), 1_000);
    assert_eq!(second.await.unwrap().len(), 1_000);
}

/// Counts its clones, to see which outputs the tee still feeds.
#[derive(Debug)]
struct Counted(u32, Arc<AtomicUsize>);

impl Clone for Counted {
    fn clone(&self) -> Self {
        self.1.fetch_add(1, Ordering::SeqCst);
        Counted(self.0, Arc::clone(&self.1))
    }
}

/// Feeds values one at a time to a tee with `policies`, keeps the first output and drops the
/// second after one value: the tee must make no more clones for it.
async fn a_dropped_second_output_gets_no_more_clones(policies: [Policy; 2]) {
    let clones = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = tokio::sync::mpsc::channel::<Counted>(1);
    let input =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) });
    let mut outputs = tee_with(CancellationToken::new(), input, policies);
    let mut kept = outputs.remove(0);
    tx.send(Counted(1, Arc::clone(&clones))).await.unwrap();
    assert_eq!(kept.next().await.map(|c| c.0), Some(1));
    assert_eq!(
        clones.load(Ordering::SeqCst),
        1,
        "one clone while both are live"
    );
    drop(outputs);
    for n in 2..=4 {
        tx.send(Counted(n, Arc::clone(&clones))).await.unwrap();
        assert_eq!(kept.next().await.map(|c| c.0), Some(n));
    }
    assert_eq!(
        clones.load(Ordering::SeqCst),
        1,
        "no clone for an output that is gone"
    );
    drop(tx);
    assert!(kept.next().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_dropped_drop_oldest_output_is_noticed_and_no_longer_fed() {
    // Its channel the tee itself keeps open (to evict from it).
    a_dropped_second_output_gets_no_more_clones([Policy::lockstep(8), Policy::drop_oldest(1)])
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_full_lockstep_output_does_not_hold_back_the_outputs_that_never_wait() {
    let mut outputs = tee_with(
        CancellationToken::new(),
        futures::stream::iter(0..10),
        [Policy::lockstep(1), Policy::drop_oldest(2)],
    );
    let mut live = outputs.pop().unwrap();
    let _unread = outputs.pop().unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    // The lockstep output holds 0 and the tee waits with 1: the drop-oldest one got 1 too.
    let first_two = tokio::time::timeout(
        Duration::from_secs(1),
        (&mut live).take(2).collect::<Vec<_>>(),
    );
    assert_eq!(first_two.await.expect("not held back"), [0, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_the_multi_thread_runtime() {
    for _ in 0..20 {
        let outputs = tee_n(
            CancellationToken::new(),
            futures::stream::iter(0..2_000_u32),
            4,
        );
        let handles: Vec<_> = outputs.into_iter().map(drain).collect();
        for handle in handles {
            assert_eq!(handle.await.unwrap(), (0..2_000).collect::<Vec<_>>());
        }
    }
}

#[tokio::test]
async fn tee_gives_two_lockstep_outputs() {
    let (left, right) = tee(CancellationToken::new(), futures::stream::iter(["a"]));
    assert_eq!(left.policy(), Policy::default());
    assert_eq!(
        right.policy(),
        Policy::Lockstep {
            capacity: taskweave_tee::DEFAULT_CAPACITY
        }
    );
}

#[test]
#[should_panic(expected = "tee: an output's capacity must be greater than zero")]
fn a_zero_capacity_panics() {
    let _ = Policy::drop_oldest(0);
}

#[tokio::test]
#[should_panic(expected = "tee: an output's capacity must be greater than zero")]
async fn a_zero_capacity_written_out_panics_too() {
    let _ = tee_with(
        CancellationToken::new(),
        futures::stream::iter([1]),
        [Policy::Lockstep { capacity: 0 }],
    );
}

#[test]
#[should_panic(
    expected = "tee: an output's capacity of 18446744073709551615 is above MAX_CAPACITY (1048576)"
)]
fn a_capacity_near_usize_max_is_refused_before_anything_is_allocated() {
    let _ = Policy::lockstep(usize::MAX);
}

#[tokio::test]
#[should_panic(expected = "tee_n: 18446744073709551615 outputs is more than MAX_OUTPUTS (65536)")]
async fn an_output_count_near_usize_max_is_refused_before_anything_is_allocated() {
    let _ = tee_n(
        CancellationToken::new(),
        futures::stream::iter([1]),
        usize::MAX,
    );
}

#[tokio::test]
#[should_panic(expected = "tee_with: more than MAX_OUTPUTS (65536) outputs")]
async fn an_endless_iterator_of_policies_is_refused_not_collected() {
    let _ = tee_with(
        CancellationToken::new(),
        futures::stream::iter([1]),
        std::iter::repeat(Policy::default()),
    );
}

#[tokio::test]
#[should_panic(expected = "tee_n: n must be greater than zero")]
async fn zero_outputs_panic() {
    let _ = tee_n(CancellationToken::new(), futures::stream::iter([1]), 0);
}

#[tokio::test]
#[should_panic(expected = "tee_with: at least one output is needed")]
async fn no_policies_panic() {
    let _ = tee_with(CancellationToken::new(), futures::stream::iter([1]), []);
}

proptest! {
    /// Consumers reading at different random paces: every lockstep output gets the same
    /// sequence, the input's.
    #[test]
    fn every_lockstep_output_gets_the_same_sequence(
        items in proptest::collection::vec(any::<u16>(), 0..100),
        paces in proptest::collection::vec(0_u64..5, 1..5),
        capacity in 1_usize..4,
    ) {
        let runtime = taskweave_testkit::paused_runtime();
        let expected = items.clone();
        let got: Vec<Vec<u16>> = runtime.block_on(async move {
            let policies = vec![Policy::lockstep(capacity); paces.len()];
            let outputs = tee_with(CancellationToken::new(), futures::stream::iter(items), policies);
            let readers = outputs.into_iter().zip(paces).map(|(mut output, pace)| {
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    while let Some(v) = output.next().await {
                        got.push(v);
                        tokio::time::sleep(Duration::from_millis(pace)).await;
                    }
                    got
                })
            });
            let mut all = Vec::new();
            for reader in readers.collect::<Vec<_>>() {
                all.push(reader.await.unwrap());
            }
            all
        });
        for output in got {
            prop_assert_eq!(&output, &expected);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_batch_larger_than_a_disconnect_outputs_room_fills_it_then_cuts_it_off() {
    // The ten values are ready at once, and the lockstep output has room for all of them:
    // they go out as one batch, of which the disconnect output takes what fits.
    let mut outputs = tee_with(
        CancellationToken::new(),
        futures::stream::iter(0..10),
        [Policy::lockstep(16), Policy::disconnect(3)],
    );
    let mut laggard = outputs.pop().unwrap();
    let steady = outputs.pop().unwrap();
    assert_eq!(
        steady.collect::<Vec<_>>().await,
        (0..10).collect::<Vec<_>>()
    );
    assert!(laggard.is_disconnected());
    assert_eq!((&mut laggard).collect::<Vec<_>>().await, [0, 1, 2]);
}

#[tokio::test(start_paused = true)]
async fn a_batch_larger_than_a_drop_oldest_outputs_room_keeps_its_newest() {
    let mut outputs = tee_with(
        CancellationToken::new(),
        futures::stream::iter(0..50),
        [Policy::lockstep(64), Policy::drop_oldest(3)],
    );
    let dashboard = outputs.pop().unwrap();
    let archive = outputs.pop().unwrap();
    assert_eq!(
        archive.collect::<Vec<_>>().await,
        (0..50).collect::<Vec<_>>()
    );
    assert_eq!(dashboard.lagged(), 47);
    assert_eq!(dashboard.collect::<Vec<_>>().await, [47, 48, 49]);
}

#[tokio::test]
async fn a_tee_over_an_always_ready_input_gives_way_within_1024_values() {
    // On one thread, the tee's task is polled before the observer (tokio runs tasks in the
    // order they were woken). It runs on its whole budget, one unit per 8 values read: the
    // observer gets its turn after at most 128 × 8 values. Its outputs never wait (nobody
    // reads them); the input is finite so that a tee that never gives way ends instead of
    // hanging the test.
    let read = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&read);
    let input = futures::stream::iter(0_u64..1_000_000).inspect(move |_| {
        counted.fetch_add(1, Ordering::Relaxed);
    });
    let token = CancellationToken::new();
    let outputs = tee_with(
        token.clone(),
        input,
        [Policy::drop_oldest(4), Policy::disconnect(1 << 20)],
    );
    let observer = {
        let read = Arc::clone(&read);
        tokio::spawn(async move {
            let before = read.load(Ordering::Relaxed);
            token.cancel();
            before
        })
    };
    let before_the_observer = observer.await.unwrap();
    assert!(
        (1..=1024).contains(&before_the_observer),
        "the tee read {before_the_observer} values before another task ran"
    );
    drop(outputs);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_lockstep_output_is_noticed_and_no_longer_fed() {
    // Its buffer still holds value 1 when it is dropped.
    a_dropped_second_output_gets_no_more_clones([Policy::lockstep(8), Policy::lockstep(8)]).await;
}

#[tokio::test(start_paused = true)]
async fn a_cancel_while_waiting_on_a_full_output_still_hands_the_value_to_those_with_room() {
    let token = CancellationToken::new();
    let (tx, rx) = tokio::sync::mpsc::channel::<u32>(1);
    let input =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) });
    let mut outputs = tee_with(
        token.clone(),
        input,
        [Policy::lockstep(1), Policy::lockstep(8)],
    );
    let roomy = outputs.pop().unwrap();
    let full = outputs.pop().unwrap();
    tx.send(0).await.unwrap();
    tx.send(1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    // The first output holds 0, and the tee waits for room there with 1.
    assert_eq!((full.len(), roomy.len()), (1, 1));
    token.cancel();
    assert_eq!(
        roomy.collect::<Vec<_>>().await,
        [0, 1],
        "1 read before the cancel"
    );
    assert_eq!(full.collect::<Vec<_>>().await, [0]);
}

/// Panics when dropped, once (the first drop of any copy of the armed value).
#[derive(Clone, Debug)]
struct Bomb(u32, Arc<AtomicUsize>);

impl Drop for Bomb {
    fn drop(&mut self) {
        if self.0 == 3 && self.1.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("value 3 exploded");
        }
    }
}

#[tokio::test]
async fn a_value_whose_drop_panics_when_evicted_costs_no_output_a_value() {
    let fuse = Arc::new(AtomicUsize::new(0));
    let values: Vec<Bomb> = (0..10).map(|n| Bomb(n, Arc::clone(&fuse))).collect();
    let mut outputs = tee_with(
        CancellationToken::new(),
        futures::stream::iter(values),
        [Policy::lockstep(16), Policy::drop_oldest(1)],
    );
    let dashboard = outputs.pop().unwrap();
    let archive = outputs.pop().unwrap();
    // One batch of ten: the drop-oldest output keeps 9 and evicts 0 to 8, whose copies the
    // tee drops after the archive has its share; the copy of 3 panics there.
    let archived: Vec<u32> = archive.map(|b| b.0).collect().await;
    assert_eq!(archived, (0..10).collect::<Vec<_>>());
    assert!(
        fuse.load(Ordering::SeqCst) > 0,
        "the armed copy was dropped"
    );
    assert!(
        dashboard.panic().is_none(),
        "caught and logged, not the tee's end"
    );
    assert_eq!(dashboard.lagged(), 9);
    assert_eq!(dashboard.map(|b| b.0).collect::<Vec<_>>().await, [9]);
}

#[tokio::test]
async fn values_left_in_a_dropped_drop_oldest_output_whose_drop_panics_cost_no_output_a_value() {
    let fuse = Arc::new(AtomicUsize::new(0));
    let (input, values) = futures::channel::mpsc::unbounded();
    let mut outputs = tee_with(
        CancellationToken::new(),
        values,
        [Policy::lockstep(16), Policy::drop_oldest(8)],
    );
    let dashboard = outputs.pop().unwrap();
    let mut archive = outputs.pop().unwrap();
    for n in 0..4 {
        input.unbounded_send(Bomb(n, Arc::clone(&fuse))).unwrap();
    }
    // Kept until the end: the first drop of a copy of 3 is the one that panics, and it must
    // be the tee's.
    let mut kept = Vec::new();
    for n in 0..4 {
        let value = archive.next().await.unwrap();
        assert_eq!(value.0, n);
        kept.push(value);
    }
    // The dashboard's copies of 0 to 3 are still in its channel; its consumer goes. The tee
    // drops them when it sees the output gone: the copy of 3 panics there.
    drop(dashboard);
    for n in 4..6 {
        input.unbounded_send(Bomb(n, Arc::clone(&fuse))).unwrap();
    }
    drop(input);
    let rest: Vec<u32> = (&mut archive).map(|b| b.0).collect().await;
    assert_eq!(rest, [4, 5], "the other output goes on");
    assert!(
        fuse.load(Ordering::SeqCst) > 0,
        "the armed copy was dropped"
    );
    assert!(
        archive.panic().is_none(),
        "caught and logged, not the tee's end"
    );
    drop(kept);
}

/// A value whose `clone` panics for 1, and whose `Drop` panics for the original 1.
struct BadClone(u32);

impl Clone for BadClone {
    fn clone(&self) -> Self {
        assert!(self.0 != 1, "clone exploded");
        BadClone(self.0)
    }
}

impl Drop for BadClone {
    fn drop(&mut self) {
        assert!(self.0 != 1, "drop exploded");
    }
}

#[tokio::test]
async fn a_value_whose_clone_and_drop_both_panic_ends_the_tee_without_an_abort() {
    let values: Vec<BadClone> = (0..3).map(BadClone).collect();
    let (first, mut second) = tee(CancellationToken::new(), futures::stream::iter(values));
    assert_eq!(first.map(|v| v.0).collect::<Vec<_>>().await, [0]);
    assert_eq!((&mut second).map(|v| v.0).collect::<Vec<_>>().await, [0]);
    let panic = second.panic().expect("the clone's panic ends the tee");
    assert_eq!(panic.message(), "clone exploded");
    assert!(
        panic
            .location()
            .is_some_and(|at| at.contains("tests/it/policies.rs")),
        "the clone's panic keeps its site through the value's Drop: {:?}",
        panic.location()
    );
}
