//! `TickLimiter` on the paused clock.

use std::time::Duration;

use taskweave_limit::{TickLimiter, WaitError};
use tokio::time::Instant;
use tokio_test::{assert_pending, assert_ready};
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);

#[tokio::test(start_paused = true)]
async fn callers_go_through_one_per_period_in_call_order() {
    let limiter = TickLimiter::new(100 * MS);
    let origin = Instant::now();
    let mut tasks = Vec::new();
    for n in 0..4_u64 {
        let limiter = limiter.clone();
        tasks.push(tokio::spawn(async move {
            limiter.wait(&CancellationToken::new()).await.unwrap();
            (n, origin.elapsed())
        }));
        tokio::task::yield_now().await;
    }
    let mut times = Vec::new();
    for task in tasks {
        times.push(task.await.unwrap());
    }
    assert_eq!(
        times,
        [
            (0, Duration::ZERO),
            (1, 100 * MS),
            (2, 200 * MS),
            (3, 300 * MS)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn missed_ticks_are_not_replayed() {
    let limiter = TickLimiter::new(100 * MS);
    let token = CancellationToken::new();
    limiter.wait(&token).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = Instant::now();
    limiter.wait(&token).await.unwrap();
    limiter.wait(&token).await.unwrap();
    // The first goes at once; the second still waits a whole period: no burst.
    assert_eq!(started.elapsed(), 100 * MS);
}

#[tokio::test(start_paused = true)]
async fn close_ends_every_wait_with_closed() {
    let limiter = TickLimiter::new(100 * MS);
    let token = CancellationToken::new();
    limiter.wait(&token).await.unwrap();
    let mut waiter = tokio_test::task::spawn(limiter.wait(&token));
    assert_pending!(waiter.poll());
    limiter.close();
    assert!(waiter.is_woken());
    assert_eq!(assert_ready!(waiter.poll()), Err(WaitError::Closed));
    assert_eq!(limiter.wait(&token).await, Err(WaitError::Closed));
    assert!(limiter.is_closed());
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_gives_its_slot_back() {
    let limiter = TickLimiter::new(100 * MS);
    limiter.wait(&CancellationToken::new()).await.unwrap();
    let token = CancellationToken::new();
    let mut waiter = tokio_test::task::spawn(limiter.wait(&token));
    assert_pending!(waiter.poll());
    token.cancel();
    assert_eq!(assert_ready!(waiter.poll()), Err(WaitError::Cancelled));
    drop(waiter);
    let started = Instant::now();
    limiter.wait(&CancellationToken::new()).await.unwrap();
    assert_eq!(
        started.elapsed(),
        100 * MS,
        "the slot at 100 ms was given back"
    );
}

#[test]
#[should_panic(expected = "period must be greater than zero")]
fn zero_period_is_a_programmer_error() {
    let _ = TickLimiter::new(Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_period_of_duration_max_lets_one_through_then_waits_instead_of_panicking() {
    let limiter = TickLimiter::new(Duration::MAX);
    let token = CancellationToken::new();
    limiter.wait(&token).await.unwrap();
    // The next slot is beyond any test's horizon: a year of waiting does not reach it.
    let second = tokio::time::timeout(Duration::from_secs(365 * 24 * 3600), limiter.wait(&token));
    assert!(second.await.is_err(), "the second wait must not go through");
    // The abandoned wait gave its slot back, and a cancelled one does not panic either.
    token.cancel();
    assert_eq!(limiter.wait(&token).await, Err(WaitError::Cancelled));
}
