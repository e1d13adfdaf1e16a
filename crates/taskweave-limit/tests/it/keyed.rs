//! `KeyedRateLimiter`: per-key buckets and bounded memory.

use std::time::Duration;

use taskweave_limit::{CheckError, KeyedRateLimiter, Quota, WaitError};
use taskweave_testkit::{alive_tasks, assert_no_leaked_tasks};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// `per_second` a second per key in bursts of `burst`, at most `max_keys`, on tokio's clock.
fn paused<K>(
    per_second: u32,
    burst: u32,
    max_keys: usize,
) -> taskweave_limit::KeyedRateLimiterBuilder<K> {
    KeyedRateLimiter::builder(Quota::per_second(per_second).with_burst(burst))
        .max_keys(max_keys)
        .tokio_clock()
}

#[tokio::test(start_paused = true)]
async fn every_key_has_its_own_bucket() {
    let limiter = paused(10, 2, 100).build();
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
    let limiter = paused(10, 1, 1_000).token(token.clone()).build();
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
    let limiter = paused(10, 1, 100).build();
    assert!(limiter.allow(&"a"));
    assert_eq!(limiter.evict_idle(), 0, "still draining: kept");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(limiter.evict_idle(), 1);
    assert!(limiter.allow(&"a"));
}

#[tokio::test(start_paused = true)]
async fn a_sweep_period_too_long_for_the_clock_never_sweeps_and_never_panics() {
    let baseline = alive_tasks();
    let limiter = paused::<u8>(10, 1, 10).sweep_every(Duration::MAX).build();
    for round in 0..5 {
        assert!(limiter.allow(&round));
        // Lets the sweep task run: one that panicked would be spawned again at the next use.
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        assert_eq!(alive_tasks(), baseline + 1, "one sweep task, still running");
    }
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(alive_tasks(), baseline + 1);
    drop(limiter);
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn dropping_the_limiter_stops_its_eviction_task() {
    let baseline = alive_tasks();
    let limiter = paused::<u8>(10, 1, 10).build();
    assert_eq!(alive_tasks(), baseline, "the sweep starts at the first use");
    assert!(limiter.allow(&1));
    assert_eq!(alive_tasks(), baseline + 1);
    drop(limiter);
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_returns_cancelled_and_consumes_nothing() {
    let limiter = paused(10, 1, 10).build();
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
        let limiter = paused(1, 1, max_keys).build();
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

#[tokio::test(start_paused = true)]
async fn a_flood_of_new_keys_evicts_the_keys_closest_to_full_not_the_drained_one() {
    // 16 shards of 64; every flood key takes one token of ten and stays draining (the clock
    // is paused), so making room must choose among draining buckets.
    let limiter = paused(1, 10, 1_024).build();
    let abuser = u32::MAX;
    while limiter.allow(&abuser) {}
    for key in 0..100_000_u32 {
        assert!(limiter.allow(&key), "a new key has a full bucket");
        assert!(limiter.len() <= 1_024, "bound exceeded: {}", limiter.len());
    }
    assert!(
        !limiter.allow(&abuser),
        "the drained key kept its bucket through 100,000 new keys"
    );
    // Each time a shard of 64 makes room it frees 4 slots, then takes the new key: every
    // shard ends 0 to 3 short of full, and not all of them full (a chance of 4⁻¹⁶ that every
    // shard's last insert filled it; freeing one slot per scan keeps all 16 full).
    let len = limiter.len();
    assert!((1_024 - 16 * 3..1_024).contains(&len), "{len} keys");
}

#[test]
#[should_panic(expected = "max_keys must be greater than zero")]
fn zero_keys_is_a_programmer_error() {
    let _ = KeyedRateLimiter::<u8>::builder(Quota::per_second(1)).max_keys(0);
}

#[test]
fn building_needs_no_runtime_and_the_sweep_starts_at_the_first_use_in_one() {
    let limiter = KeyedRateLimiter::builder(Quota::per_second(10).with_burst(1))
        .max_keys(10)
        .build();
    assert!(
        limiter.allow(&"outside"),
        "works without a runtime (no sweep yet)"
    );
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    };
    // Dropping the first runtime drops the sweep with it; the next use, on another runtime,
    // starts it again.
    for key in ["first", "second"] {
        runtime().block_on(async {
            let baseline = alive_tasks();
            assert!(limiter.allow(&key));
            assert_eq!(alive_tasks(), baseline + 1, "{key} runtime: the sweep runs");
        });
    }
    runtime().block_on(async {
        let baseline = alive_tasks();
        assert!(limiter.allow(&"inside"));
        assert_eq!(alive_tasks(), baseline + 1, "the sweep started");
        drop(limiter);
        assert_no_leaked_tasks(baseline).await;
    });
}

#[tokio::test(start_paused = true)]
async fn the_default_clock_keeps_per_key_buckets() {
    // Room for both keys in any shard (with 10 keys a shard holds one, and "b" could evict
    // "a", which then starts again with a full bucket: the documented bound over the limit).
    let limiter = KeyedRateLimiter::builder(Quota::every(Duration::from_secs(3600)))
        .max_keys(1_000)
        .build();
    assert!(limiter.allow(&"a"));
    assert!(!limiter.allow(&"a"));
    assert!(limiter.allow(&"b"));
    // An hour of paused tokio time does not refill the time-stamp counter's bucket.
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(!limiter.allow(&"a"));
}

#[tokio::test(start_paused = true)]
async fn keyed_wait_n_and_reserve_offer_what_the_direct_limiter_does() {
    let limiter = paused(10, 3, 10).build();
    let token = CancellationToken::new();
    let started = Instant::now();
    limiter.wait_n(&token, &"a", 3).await.unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(
        limiter.wait_n(&token, &"a", 4).await,
        Err(WaitError::ExceedsBurst {
            requested: 4,
            burst: 3
        })
    );
    let first = limiter.reserve_n(&"a", 1).unwrap();
    let second = limiter.reserve_n(&"a", 1).unwrap();
    assert_eq!(
        (first.delay(), second.delay()),
        (Duration::from_millis(100), Duration::from_millis(200))
    );
    second.cancel();
    assert_eq!(
        limiter.check_n(&"a", 1),
        Err(CheckError::NotYet {
            wait: Duration::from_millis(200)
        }),
        "the cancelled token is back, the first reservation keeps its place"
    );
    assert!(limiter.allow_n(&"b", 3));
    drop(first);
}

#[tokio::test(start_paused = true)]
async fn a_keyed_wait_whose_token_is_already_cancelled_takes_nothing() {
    let limiter = paused(10, 1, 10).build();
    let token = CancellationToken::new();
    token.cancel();
    assert_eq!(limiter.wait(&token, &1).await, Err(WaitError::Cancelled));
    assert!(limiter.allow(&1), "the token is still there");
}

#[tokio::test(start_paused = true)]
async fn a_reservation_of_an_evicted_bucket_refunds_nothing_into_its_successor() {
    let limiter = paused(1, 1, 1).build();
    let first = limiter.reserve_n(&"a", 1).unwrap();
    let second = limiter.reserve_n(&"a", 1).unwrap();
    assert!(limiter.allow(&"b"), "evicts \"a\"");
    assert!(limiter.allow(&"a"), "evicts \"b\": a new bucket for \"a\"");
    second.cancel();
    assert!(
        !limiter.allow(&"a"),
        "the old reservation gave nothing to the new bucket"
    );
    drop(first);
}
