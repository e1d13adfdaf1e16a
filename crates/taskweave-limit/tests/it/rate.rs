//! `RateLimiter` on the paused clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use taskweave_limit::{CheckError, Quota, RateLimiter, WaitError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);

/// `per_second` tokens a second in bursts of `burst`, on tokio's (paused) clock.
fn paused(per_second: u32, burst: u32) -> RateLimiter {
    RateLimiter::new(Quota::per_second(per_second).with_burst(burst)).with_tokio_clock()
}

/// One token an hour in bursts of `burst`.
fn hourly(burst: u32) -> Quota {
    Quota::every(Duration::from_secs(3600)).with_burst(burst)
}

#[test]
fn fifteen_concurrent_allows_on_a_burst_of_five_grant_exactly_five() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    runtime.block_on(async {
        // A slow rate, so that no token comes back during the test.
        // One token an hour: none comes back while the test runs, however slow the machine.
        let limiter = RateLimiter::new(hourly(5));
        let granted = Arc::new(AtomicUsize::new(0));
        let start = Arc::new(tokio::sync::Barrier::new(15));
        let tasks: Vec<_> = (0..15)
            .map(|_| {
                let limiter = limiter.clone();
                let granted = Arc::clone(&granted);
                let start = Arc::clone(&start);
                tokio::spawn(async move {
                    start.wait().await;
                    if limiter.allow() {
                        granted.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(granted.load(Ordering::SeqCst), 5);
    });
}

#[tokio::test(start_paused = true)]
async fn a_wait_cancelled_before_it_can_finish_consumes_nothing() {
    let limiter = paused(10, 1);
    assert!(limiter.allow());
    let token = CancellationToken::new();
    let deadline = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(50 * MS).await; // the next token is due at 100 ms
        deadline.cancel();
    });
    assert_eq!(limiter.wait(&token).await, Err(WaitError::Cancelled));
    tokio::time::sleep(50 * MS).await;
    assert!(limiter.allow(), "the token due at 100 ms is still there");
}

#[tokio::test(start_paused = true)]
async fn a_long_run_at_100_per_second_grants_100_per_second() {
    let limiter = paused(100, 1);
    let token = CancellationToken::new();
    let started = Instant::now();
    let mut granted = 0_u32;
    while started.elapsed() < Duration::from_secs(10) {
        limiter.wait(&token).await.unwrap();
        granted += 1;
    }
    // 10 s of paused time: one at 0 ms and one every 10 ms after, give or take the last.
    assert!((999..=1001).contains(&granted), "granted {granted}");
}

#[tokio::test(start_paused = true)]
async fn burst_then_steady_rate() {
    let limiter = paused(10, 3);
    assert_eq!(limiter.available(), 3);
    assert!(limiter.allow() && limiter.allow() && limiter.allow());
    assert_eq!(limiter.available(), 0);
    assert_eq!(
        limiter.check_n(1),
        Err(CheckError::NotYet { wait: 100 * MS })
    );
    tokio::time::sleep(250 * MS).await;
    assert_eq!(limiter.available(), 2);
}

#[tokio::test(start_paused = true)]
async fn more_than_the_burst_is_an_error_not_a_hang() {
    let limiter = paused(10, 3);
    let token = CancellationToken::new();
    assert_eq!(
        limiter.check_n(4),
        Err(CheckError::ExceedsBurst {
            requested: 4,
            burst: 3
        })
    );
    assert_eq!(
        limiter.wait_n(&token, 4).await,
        Err(WaitError::ExceedsBurst {
            requested: 4,
            burst: 3
        })
    );
    assert!(limiter.reserve_n(4).is_err());
    limiter.wait_n(&token, 3).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_reservation_says_when_and_cancel_gives_the_tokens_back() {
    let limiter = paused(10, 1);
    let now = limiter.reserve();
    assert_eq!(now.delay(), Duration::ZERO);
    let later = limiter.reserve();
    assert_eq!(later.delay(), 100 * MS);
    let even_later = limiter.reserve_n(1).unwrap();
    assert_eq!(even_later.delay(), 200 * MS);
    even_later.cancel();
    later.cancel();
    // Both future tokens are back: the next one is due at 100 ms again.
    assert_eq!(
        limiter.check_n(1),
        Err(CheckError::NotYet { wait: 100 * MS })
    );
    let started = Instant::now();
    let reservation = limiter.reserve();
    reservation.ready().await;
    assert_eq!(started.elapsed(), 100 * MS);
    drop(now);
}

#[tokio::test(start_paused = true)]
async fn the_rate_and_burst_change_on_a_live_limiter() {
    let limiter = paused(10, 1);
    assert!(limiter.allow());
    limiter.set_rate(100);
    assert_eq!(limiter.interval(), 10 * MS);
    tokio::time::sleep(100 * MS).await;
    limiter.set_burst(5);
    assert_eq!(limiter.burst(), 5);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(limiter.available(), 5);
}

#[test]
#[should_panic(expected = "rate must be greater than zero")]
fn zero_rate_is_a_programmer_error() {
    let _ = Quota::per_second(0);
}

#[test]
#[should_panic(expected = "burst must be greater than zero")]
fn zero_burst_is_a_programmer_error() {
    let _ = Quota::per_second(1).with_burst(0);
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_reservation_in_the_middle_keeps_the_later_ones_in_place() {
    let limiter = paused(10, 1);
    let first = limiter.reserve(); // due at 0
    let middle = limiter.reserve(); // due at 100 ms
    let last = limiter.reserve(); // due at 200 ms
    assert_eq!((middle.delay(), last.delay()), (100 * MS, 200 * MS));
    middle.cancel();
    // `last` keeps its slot at 200 ms; the middle token is not given to anyone before it.
    assert_eq!(
        limiter.check_n(1),
        Err(CheckError::NotYet { wait: 300 * MS })
    );
    drop((first, last));
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_reservation_that_is_already_due_gives_nothing_back() {
    let limiter = paused(10, 1);
    let reservation = limiter.reserve();
    tokio::time::sleep(50 * MS).await;
    reservation.cancel();
    assert_eq!(
        limiter.check_n(1),
        Err(CheckError::NotYet { wait: 50 * MS })
    );
}

#[tokio::test(start_paused = true)]
async fn changing_the_rate_keeps_the_tokens_owed() {
    let limiter = paused(1, 10);
    for _ in 0..10 {
        assert!(limiter.allow());
    }
    limiter.set_rate(1_000);
    // Drained at 1/s and still drained at 1000/s, refilling at the new rate.
    assert_eq!(limiter.available(), 0);
    tokio::time::sleep(5 * MS).await;
    assert_eq!(limiter.available(), 5);
}

#[test]
fn the_time_stamp_counter_keeps_the_bucket_rules() {
    // One token an hour, on the default clock: the burst, then nothing.
    let limiter = RateLimiter::new(hourly(3));
    assert!(!limiter.uses_tokio_clock());
    assert!(limiter.allow() && limiter.allow() && limiter.allow());
    assert!(!limiter.allow());
    match limiter.check_n(1) {
        Err(CheckError::NotYet { wait }) => assert!(wait > Duration::from_secs(3590)),
        other => panic!("expected NotYet, got {other:?}"),
    }
}

#[test]
#[should_panic(expected = "choose the clock right after construction")]
fn choosing_the_clock_after_the_first_use_is_a_programmer_error() {
    let limiter = RateLimiter::new(hourly(1));
    assert!(limiter.allow());
    let _ = limiter.with_tokio_clock();
}

/// One token an hour, burst 1, spent: whether an hour of tokio time refills it tells which
/// clock the limiter reads.
async fn refills_after_an_hour_of_tokio_time(limiter: &RateLimiter) -> bool {
    assert!(limiter.allow());
    assert!(!limiter.allow());
    tokio::time::advance(Duration::from_secs(3600)).await;
    limiter.allow()
}

#[tokio::test(start_paused = true)]
async fn the_default_clock_ignores_the_paused_clock_wherever_it_was_made() {
    // The rule has no "first use" in it: made and used on a paused runtime, the default
    // limiter still reads the time-stamp counter.
    let limiter = RateLimiter::new(hourly(1));
    assert!(!refills_after_an_hour_of_tokio_time(&limiter).await);
}

#[tokio::test]
async fn with_tokio_clock_follows_a_pause_that_comes_after_the_first_use() {
    let limiter = RateLimiter::new(hourly(1)).with_tokio_clock();
    assert!(limiter.allow());
    tokio::time::pause();
    assert!(!limiter.allow());
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(limiter.allow());
}

#[test]
fn with_tokio_clock_made_outside_a_runtime_follows_the_paused_runtime_it_is_used_in() {
    let limiter = RateLimiter::new(hourly(1)).with_tokio_clock();
    let runtime = taskweave_testkit::paused_runtime();
    runtime.block_on(async {
        assert!(refills_after_an_hour_of_tokio_time(&limiter).await);
    });
}

#[tokio::test(start_paused = true)]
async fn a_wait_whose_token_is_already_cancelled_takes_nothing_even_with_tokens_free() {
    let limiter = paused(10, 2);
    let token = CancellationToken::new();
    token.cancel();
    assert_eq!(limiter.wait(&token).await, Err(WaitError::Cancelled));
    assert_eq!(limiter.wait_n(&token, 2).await, Err(WaitError::Cancelled));
    assert_eq!(limiter.available(), 2, "no token was spent");
}

#[test]
fn an_interval_of_duration_max_allows_the_burst_and_then_nothing() {
    for burst in [1, 3] {
        let limiter = RateLimiter::new(Quota::every(Duration::MAX).with_burst(burst));
        for _ in 0..burst {
            assert!(limiter.allow());
        }
        assert!(!limiter.allow(), "burst {burst}: one more call was allowed");
        assert!(limiter.interval() >= Duration::from_secs(365 * 24 * 3600 * 40));
    }
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_reservation_after_a_rate_change_refunds_what_the_tokens_are_worth_now() {
    // x/time/rate's TestReserveSetLimitCancel: reserve 2 of a burst of 2 at 5/s, reserve 2
    // more, 200 ms later SetLimit(10) then cancel the second: 1 token available, not 2.
    let limiter = paused(5, 2);
    let first = limiter.reserve_n(2).unwrap();
    let second = limiter.reserve_n(2).unwrap();
    assert_eq!(second.delay(), 400 * MS);
    tokio::time::sleep(200 * MS).await;
    limiter.set_rate(10);
    second.cancel();
    assert_eq!(limiter.available(), 1);
    drop(first);
}

#[tokio::test(start_paused = true)]
async fn raising_the_burst_frees_nothing_now_and_lowering_it_caps_what_is_there() {
    let limiter = paused(10, 1);
    assert!(limiter.allow());
    limiter.set_burst(5);
    assert_eq!(
        limiter.available(),
        0,
        "x/time/rate keeps the token count across SetBurst"
    );
    assert!(!limiter.allow());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(limiter.available(), 5, "the bucket now fills to 5");
    limiter.set_burst(2);
    assert_eq!(
        limiter.available(),
        2,
        "lowering the burst caps what is there"
    );
}

#[tokio::test(start_paused = true)]
async fn cancelling_at_the_due_instant_still_gives_the_tokens_back() {
    // Go refunds unless the due time is strictly before now.
    let limiter = paused(10, 1);
    assert!(limiter.allow());
    let reservation = limiter.reserve();
    assert_eq!(reservation.delay(), 100 * MS);
    tokio::time::sleep(100 * MS).await;
    reservation.cancel();
    assert_eq!(limiter.available(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_would_pass_its_deadline_fails_at_once_and_takes_nothing() {
    let limiter = paused(10, 1);
    let token = CancellationToken::new();
    assert!(limiter.allow());
    let started = Instant::now();
    assert_eq!(
        limiter.wait_n_within(&token, 1, 50 * MS).await,
        Err(WaitError::WouldExceedDeadline { wait: 100 * MS })
    );
    assert_eq!(started.elapsed(), Duration::ZERO, "failed at once");
    limiter.wait_n_within(&token, 1, 100 * MS).await.unwrap();
    assert_eq!(started.elapsed(), 100 * MS);
}

#[tokio::test(start_paused = true)]
async fn a_reservation_beyond_its_maximum_wait_takes_nothing() {
    let limiter = paused(10, 1);
    assert!(limiter.allow());
    assert_eq!(
        limiter.reserve_within(1, 50 * MS).unwrap_err(),
        CheckError::NotYet { wait: 100 * MS }
    );
    let reservation = limiter.reserve_within(1, 100 * MS).unwrap();
    assert_eq!(reservation.delay(), 100 * MS);
    assert!(!limiter.allow_n(1));
    assert!(!limiter.allow_n(2), "above the burst");
}

#[tokio::test(start_paused = true)]
async fn fractional_rates_and_a_live_interval() {
    let limiter = RateLimiter::new(Quota::every(Duration::from_secs(2))).with_tokio_clock();
    let token = CancellationToken::new();
    let started = Instant::now();
    for _ in 0..3 {
        limiter.wait(&token).await.unwrap();
    }
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(4),
        "half a token a second"
    );
    limiter.set_interval(Duration::from_millis(500));
    limiter.wait(&token).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(4_500));
    assert_eq!(limiter.quota(), Quota::every(Duration::from_millis(500)));
}

#[cfg(feature = "governor")]
#[test]
fn a_governor_quota_comes_over_unchanged() {
    let governor = governor::Quota::per_second(std::num::NonZeroU32::new(50).unwrap())
        .allow_burst(std::num::NonZeroU32::new(5).unwrap());
    let quota = Quota::from(governor);
    assert_eq!(quota, Quota::per_second(50).with_burst(5));
}

#[test]
fn reservations_past_the_clock_s_range_never_panic_and_take_nothing() {
    let limiter = RateLimiter::new(Quota::every(Duration::MAX));
    let mut due_now_or_later = 0;
    for _ in 0..6 {
        let reservation = limiter.reserve();
        if reservation.tokens() == 1 {
            due_now_or_later += 1;
        } else {
            assert_eq!(reservation.delay(), Duration::MAX, "never due");
        }
    }
    assert!(due_now_or_later >= 1, "the first one is due at once");
    assert!(matches!(
        limiter.reserve_n(1),
        Err(CheckError::NotYet {
            wait: Duration::MAX
        })
    ));
}

#[test]
fn the_interval_asked_for_survives_choosing_tokio_s_clock() {
    let quota = Quota::every(Duration::MAX).with_burst(4);
    let fast = RateLimiter::new(quota);
    let tokio = RateLimiter::new(quota).with_tokio_clock();
    fast.set_burst(1);
    tokio.set_burst(1);
    assert_eq!(fast.interval(), tokio.interval());
}

/// x/time/rate's bucket rules at fixed instants: 10 a second in bursts of 3, `(tenths of a
/// second since the start, tokens asked for, granted)`, written from its documented
/// behaviour (the burst refills one token per 100 ms, never past 3; more than the burst is
/// refused; zero tokens are always granted).
#[tokio::test(start_paused = true)]
async fn a_burst_of_three_follows_x_time_rate_step_by_step() {
    let limiter = paused(10, 3);
    let start = Instant::now();
    let steps: [(u64, u32, bool); 13] = [
        (0, 2, true),
        (0, 2, false),
        (0, 1, true),
        (0, 1, false),
        (1, 4, false),
        (2, 1, true),
        (3, 1, true),
        (4, 1, true),
        (4, 1, true),
        (4, 1, false),
        (4, 1, false),
        (9, 3, true),
        (9, 0, true),
    ];
    for (step, (tenths, n, granted)) in steps.into_iter().enumerate() {
        tokio::time::sleep_until(start + 100 * MS * u32::try_from(tenths).unwrap()).await;
        assert_eq!(
            limiter.allow_n(n),
            granted,
            "step {step}: {n} at {tenths}00 ms"
        );
    }
}
