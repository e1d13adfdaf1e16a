//! `KeyedRateLimiter`: per-key buckets and bounded memory.

use std::time::Duration;

use taskweave_limit::{KeyedRateLimiter, WaitError};
use taskweave_testkit::{alive_tasks, assert_no_leaked_tasks};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[tokio::test(start_paused = true)]
async fn every_key_has_its_own_bucket() {
    let limiter = KeyedRateLimiter::new(CancellationToken::new(), 10, 2, 100);
    assert!(limiter.allow(&1) && limiter.allow(&1));
    assert!(!limiter.allow(&1));
    assert!(limiter.allow(&2));
    let token = CancellationToken::new();
    let started = Instant::now();
    limiter.wait(&token, &1).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn a_million_distinct_keys_never_exceed_the_bound_and_idle_keys_go() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let limiter = KeyedRateLimiter::new(token.clone(), 10, 1, 1_000);
    for key in 0..1_000_000_u32 {
        assert!(limiter.allow(&key), "a new key has a full bucket");
        if key % 100_000 == 0 {
            assert!(limiter.len() <= 1_000, "bound exceeded: {}", limiter.len());
        }
    }
    assert!(limiter.len() <= 1_000);
    // After the idle time (a burst's refill, 100 ms) the eviction task empties it.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(limiter.len(), 0);
    token.cancel();
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn evicting_a_full_bucket_changes_no_decision() {
    let limiter = KeyedRateLimiter::new(CancellationToken::new(), 10, 1, 100);
    assert!(limiter.allow(&"a"));
    assert_eq!(limiter.evict_idle(), 0, "still draining: kept");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(limiter.evict_idle(), 1);
    assert!(limiter.allow(&"a"));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_limiter_stops_its_eviction_task() {
    let baseline = alive_tasks();
    let limiter = KeyedRateLimiter::<u8>::new(CancellationToken::new(), 10, 1, 10);
    assert_eq!(alive_tasks(), baseline + 1);
    drop(limiter);
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_returns_cancelled_and_consumes_nothing() {
    let limiter = KeyedRateLimiter::new(CancellationToken::new(), 10, 1, 10);
    assert!(limiter.allow(&7));
    let token = CancellationToken::new();
    let canceller = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        canceller.cancel();
    });
    assert_eq!(limiter.wait(&token, &7).await, Err(WaitError::Cancelled));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(limiter.allow(&7), "the token due at 100 ms is still there");
}

#[tokio::test(start_paused = true)]
async fn the_bound_holds_exactly_for_any_max_keys() {
    for max_keys in [1_usize, 5, 20, 33] {
        let limiter = KeyedRateLimiter::new(CancellationToken::new(), 1, 1, max_keys);
        for key in 0..1_000_u32 {
            assert!(limiter.allow(&key));
            assert!(
                limiter.len() <= max_keys,
                "{} keys for a bound of {max_keys}",
                limiter.len()
            );
        }
    }
}

#[tokio::test]
#[should_panic(expected = "max_keys must be greater than zero")]
async fn zero_keys_is_a_programmer_error() {
    let _ = KeyedRateLimiter::<u8>::new(CancellationToken::new(), 1, 1, 0);
}

#[tokio::test(start_paused = true)]
async fn the_fast_clock_keeps_per_key_buckets() {
    let limiter = KeyedRateLimiter::with_sweep(
        CancellationToken::new(),
        Duration::from_secs(3600),
        1,
        10,
        Duration::from_secs(3600),
    )
    .with_fast_clock();
    assert!(limiter.allow(&"a"));
    assert!(!limiter.allow(&"a"));
    assert!(limiter.allow(&"b"));
}

#[tokio::test]
async fn the_clock_is_chosen_at_the_first_use() {
    let limiter = |token: &CancellationToken| {
        KeyedRateLimiter::with_sweep(
            token.clone(),
            Duration::from_secs(3600),
            1,
            10,
            Duration::from_secs(3600),
        )
    };
    let token = CancellationToken::new();
    // Used in real time: the time-stamp counter, which a later pause does not move.
    let real = limiter(&token);
    let paused_later = limiter(&token);
    let forced = limiter(&token).with_tokio_clock();
    assert!(real.allow(&"a"));
    assert!(forced.allow(&"a"));
    tokio::time::pause();
    // First used on the paused clock: tokio's clock.
    assert!(paused_later.allow(&"a"));
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(!real.allow(&"a"));
    assert!(paused_later.allow(&"a"));
    assert!(forced.allow(&"a"));
    token.cancel();
}
