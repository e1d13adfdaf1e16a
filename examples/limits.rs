//! Limits: a semaphore for "at most N at once", a token bucket for "at most N per second", a
//! tick limiter for strict spacing, a keyed limiter per client, and a rate-limited stream.

#[path = "support.rs"]
mod support;

use std::time::Duration;

use futures::StreamExt;
use taskweave_limit::{KeyedRateLimiter, Quota, RateLimitExt, RateLimiter, TickLimiter};
use taskweave_semaphore::{AcquireError, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    support::init_logging("warn");
    let root = CancellationToken::new();
    let started = Instant::now();

    // At most 2 calls to the partner API at once, from 5 request handlers.
    let api = Semaphore::new(2);
    let handlers: Vec<_> = (1..=5)
        .map(|request| {
            let api = api.clone();
            let token = root.child_token();
            tokio::spawn(async move {
                let _permit = api.acquire(&token).await.expect("open");
                println!(
                    "request {request} calls the API at {:>3} ms (in use: {})",
                    started.elapsed().as_millis(),
                    api.in_use()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            })
        })
        .collect();
    for handler in handlers {
        handler.await.expect("no panic");
    }
    println!(
        "asking for 3 permits of 2: {}",
        api.acquire_many(&root, 3).await.map(|_| ()).unwrap_err()
    );
    api.close();
    assert_eq!(api.acquire(&root).await.unwrap_err(), AcquireError::Closed);

    // Tied to a component's lifetime: cancelling its token closes the semaphore, so nobody
    // is left waiting at shutdown (and waits on that token register nothing on it).
    let component = root.child_token();
    let db = Semaphore::new(1).with_token(component.clone());
    let held = db.acquire(&component).await.expect("open");
    let waiter = {
        let (db, component) = (db.clone(), component.clone());
        tokio::spawn(async move { db.acquire(&component).await.map(drop) })
    };
    tokio::task::yield_now().await;
    component.cancel();
    let ended = waiter.await.expect("no panic");
    println!("a waiter when its component shuts down: {ended:?}");
    assert_eq!(ended, Err(AcquireError::Cancelled));
    drop(held);

    // 20 emails a second with bursts of 3.
    let outbound = RateLimiter::new(Quota::per_second(20).with_burst(3));
    let started = Instant::now();
    for email in 1..=6 {
        outbound.wait(&root).await.expect("not cancelled");
        println!("email {email} at {:>3} ms", started.elapsed().as_millis());
    }
    let reservation = outbound.reserve();
    println!(
        "a reserved token is due in {:?}; cancelled",
        reservation.delay()
    );
    reservation.cancel();

    // Never two polls within 100 ms, even after a quiet spell.
    let poll = TickLimiter::new(Duration::from_millis(100));
    let started = Instant::now();
    for _ in 0..3 {
        poll.wait(&root).await.expect("open");
        println!("poll at {:>3} ms", started.elapsed().as_millis());
    }

    // Per client: 2 requests, then 1 every 500 ms.
    let per_client = KeyedRateLimiter::builder(Quota::per_second(2))
        .max_keys(10_000)
        .token(root.clone())
        .build();
    for client in ["alice", "alice", "alice", "bob"] {
        println!(
            "{client}: {}",
            if per_client.allow(&client) {
                "200"
            } else {
                "429"
            }
        );
    }

    // A stream of events at 10 per second.
    let started = Instant::now();
    let sent: Vec<u32> = futures::stream::iter(1..=4)
        .rate_limited(RateLimiter::new(Quota::per_second(10).with_burst(1)))
        .inspect(|event| println!("event {event} at {:>3} ms", started.elapsed().as_millis()))
        .collect()
        .await;
    println!("sent {sent:?}");
    root.cancel();
}
