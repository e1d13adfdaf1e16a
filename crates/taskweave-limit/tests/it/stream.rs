//! `rate_limited`: order kept, timing by the limiter, end with the input.

use std::time::Duration;

use futures::stream::FusedStream;
use futures::{Stream, StreamExt};
use taskweave_limit::{Quota, RateLimitExt, RateLimiter};
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn items_keep_their_order_and_follow_the_rate() {
    let origin = Instant::now();
    let times: Vec<(u32, u128)> = futures::stream::iter(0..5)
        .rate_limited(RateLimiter::new(Quota::per_second(10).with_burst(2)).with_tokio_clock())
        .map(|item| (item, origin.elapsed().as_millis()))
        .collect()
        .await;
    assert_eq!(times, [(0, 0), (1, 0), (2, 100), (3, 200), (4, 300)]);
}

#[tokio::test(start_paused = true)]
async fn streams_sharing_a_limiter_share_its_tokens() {
    let limiter = RateLimiter::new(Quota::per_second(10).with_burst(1)).with_tokio_clock();
    let mut a = futures::stream::iter(0..2).rate_limited(limiter.clone());
    let mut b = futures::stream::iter(0..2).rate_limited(limiter);
    let started = Instant::now();
    a.next().await.unwrap();
    b.next().await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn the_stream_ends_with_its_input() {
    let mut stream = futures::stream::iter(Vec::<u8>::new())
        .rate_limited(RateLimiter::new(Quota::per_second(1).with_burst(1)).with_tokio_clock());
    assert!(stream.next().await.is_none());
    assert!(stream.is_terminated());
    assert!(stream.next().await.is_none());
}

// Issue 20: the adapter gives its input back, with the item it had taken and was holding
// for the limiter, so that taking the input back loses nothing.
#[tokio::test(start_paused = true)]
async fn into_inner_hands_back_the_input_and_the_item_held_for_the_limiter() {
    let limiter = RateLimiter::new(Quota::per_second(10).with_burst(1)).with_tokio_clock();
    let mut limited = futures::stream::iter(0..5).rate_limited(limiter);
    assert_eq!(limited.next().await, Some(0));
    // The next item is taken from the input and waits for a token.
    assert!(futures::poll!(limited.next()).is_pending());
    assert_eq!(limited.get_ref().size_hint(), (3, Some(3)));
    assert_eq!(limited.get_mut().size_hint(), (3, Some(3)));
    let (rest, held) = limited.into_inner();
    assert_eq!(held, Some(1));
    assert_eq!(rest.collect::<Vec<_>>().await, [2, 3, 4]);
}
