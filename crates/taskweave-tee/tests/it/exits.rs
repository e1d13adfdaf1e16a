//! The tee's task stops, and every output ends, on every exit path.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::FusedStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use taskweave_tee::{Policy, tee, tee_n, tee_with};
use tokio_util::sync::CancellationToken;

use crate::{alive_tasks, assert_no_leaked_tasks};

#[tokio::test]
async fn input_end_ends_every_output() {
    let baseline = alive_tasks();
    let (mut left, mut right) = tee(CancellationToken::new(), futures::stream::iter([1, 2]));
    assert_eq!((&mut left).collect::<Vec<_>>().await, [1, 2]);
    assert_eq!((&mut right).collect::<Vec<_>>().await, [1, 2]);
    assert!(left.is_terminated() && right.is_terminated());
    assert!(left.panic().is_none());
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn cancel_ends_every_output_even_while_the_tee_waits_on_a_full_one() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let (left, mut right) = tee(token.clone(), futures::stream::iter(0..));
    tokio::time::sleep(Duration::from_millis(1)).await;
    token.cancel();
    let buffered = (&mut right).count().await;
    assert!(
        buffered <= taskweave_tee::DEFAULT_CAPACITY + 1,
        "{buffered}"
    );
    assert_no_leaked_tasks(baseline).await;
    drop(left);
}

#[tokio::test(start_paused = true)]
async fn dropping_every_output_stops_a_tee_waiting_on_its_input() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let outputs = tee_n(token.clone(), futures::stream::pending::<u8>(), 3);
    tokio::time::sleep(Duration::from_millis(1)).await;
    drop(outputs);
    assert_no_leaked_tasks(baseline).await;
    assert!(!token.is_cancelled(), "only the tee's own child token");
}

#[tokio::test]
async fn a_panicking_input_ends_every_output_and_says_why() {
    let baseline = alive_tasks();
    let input = futures::stream::iter(0..5).map(|n| {
        assert!(n < 2, "input broke at {n}");
        n
    });
    let (mut left, right) = tee(CancellationToken::new(), input);
    assert_eq!((&mut left).collect::<Vec<_>>().await, [0, 1]);
    assert_eq!(right.collect::<Vec<_>>().await, [0, 1]);
    assert_eq!(
        left.panic().expect("reported").message(),
        "input broke at 2"
    );
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn outputs_that_are_all_disconnected_stop_the_tee_even_while_held() {
    let baseline = alive_tasks();
    let mut outputs = tee_with(
        CancellationToken::new(),
        futures::stream::iter(0..).then(|n| async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            n
        }),
        [Policy::disconnect(2), Policy::disconnect(3)],
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Both outputs were cut off; the tee stopped without waiting for another value.
    assert_no_leaked_tasks(baseline).await;
    for output in &outputs {
        assert!(output.is_disconnected());
    }
    assert_eq!(outputs[0].by_ref().count().await, 2);
    assert_eq!(outputs[1].by_ref().count().await, 3);
}

/// Panics on clone number `.1` (counted over all copies).
#[derive(Debug)]
struct Fragile(Arc<AtomicUsize>, usize);

impl Clone for Fragile {
    fn clone(&self) -> Self {
        let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(n < self.1, "clone {n} failed");
        Fragile(Arc::clone(&self.0), self.1)
    }
}

#[tokio::test]
async fn a_panicking_clone_ends_every_output_and_says_why() {
    let baseline = alive_tasks();
    let clones = Arc::new(AtomicUsize::new(0));
    let values: Vec<Fragile> = (0..5).map(|_| Fragile(Arc::clone(&clones), 3)).collect();
    let (left, right) = tee(CancellationToken::new(), futures::stream::iter(values));
    let (left_got, right_got) = tokio::join!(left.count(), right.count());
    // Values 0 and 1 went out (one clone each); the clone for value 2 panicked.
    assert_eq!((left_got, right_got), (2, 2));
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test]
async fn a_clone_panicking_in_a_batch_leaves_each_output_what_one_value_at_a_time_would() {
    // Five values ready at once, three outputs: each value is copied to the first two (the
    // last takes the original) before the next value is. Value 0 takes clones 1 and 2,
    // value 1 clone 3 (the first output) and then clone 4 panics (the second output).
    let baseline = alive_tasks();
    let clones = Arc::new(AtomicUsize::new(0));
    let values: Vec<Fragile> = (0..5).map(|_| Fragile(Arc::clone(&clones), 4)).collect();
    let mut outputs = tee_n(CancellationToken::new(), futures::stream::iter(values), 3);
    let third = outputs.pop().unwrap();
    let second = outputs.pop().unwrap();
    let first = outputs.pop().unwrap();
    let (first, second, third) = tokio::join!(first.count(), second.count(), third.count());
    assert_eq!((first, second, third), (2, 1, 1));
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test]
async fn an_input_panicking_after_a_batch_of_ready_values_hands_them_all_on_first() {
    let input = futures::stream::iter(0..100).map(|n| {
        assert!(n < 40, "input broke at {n}");
        n
    });
    let (left, right) = tee(CancellationToken::new(), input);
    let (left_got, right_got) = tokio::join!(left.collect::<Vec<_>>(), right.collect::<Vec<_>>());
    assert_eq!(left_got, (0..40).collect::<Vec<_>>());
    assert_eq!(right_got, (0..40).collect::<Vec<_>>());
}
