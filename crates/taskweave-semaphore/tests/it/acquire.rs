//! Acquiring and releasing: RAII, errors that say why, close.

use taskweave_semaphore::{AcquireError, Semaphore, TryAcquireError};
use tokio_test::{assert_pending, assert_ready};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn permits_are_released_when_dropped() {
    let semaphore = Semaphore::new(3);
    let token = CancellationToken::new();
    let one = semaphore.acquire(&token).await.unwrap();
    let two = semaphore.acquire_many(&token, 2).await.unwrap();
    assert_eq!((one.num_permits(), two.num_permits()), (1, 2));
    assert_eq!((semaphore.in_use(), semaphore.available()), (3, 0));
    assert_eq!(
        semaphore.try_acquire().unwrap_err(),
        TryAcquireError::NoPermits
    );
    drop(two);
    assert_eq!((semaphore.in_use(), semaphore.available()), (1, 2));
    drop(one);
    assert_eq!(semaphore.in_use(), 0);
}

#[tokio::test]
async fn owned_permits_move_into_tasks() {
    let semaphore = Semaphore::new(1);
    let token = CancellationToken::new();
    let permit = semaphore.acquire_owned(&token).await.unwrap();
    let task = tokio::spawn(async move {
        let _permit = permit;
    });
    task.await.unwrap();
    assert_eq!(semaphore.available(), 1);
    let owned = semaphore.try_acquire_many_owned(1).unwrap();
    assert_eq!(owned.num_permits(), 1);
    assert!(semaphore.try_acquire_owned().is_err());
    drop(owned);
    assert!(semaphore.try_acquire_owned().is_ok());
}

#[tokio::test]
async fn a_request_above_the_capacity_fails_at_once() {
    let semaphore = Semaphore::new(4);
    let token = CancellationToken::new();
    assert_eq!(
        semaphore.acquire_many(&token, 5).await.unwrap_err(),
        AcquireError::TooLarge {
            requested: 5,
            capacity: 4
        }
    );
    assert_eq!(
        semaphore.try_acquire_many(5).unwrap_err(),
        TryAcquireError::TooLarge {
            requested: 5,
            capacity: 4
        }
    );
    assert_eq!(
        AcquireError::TooLarge {
            requested: 5,
            capacity: 4
        }
        .to_string(),
        "requested 5 permits of a semaphore of 4"
    );
}

#[tokio::test]
async fn cancelling_the_token_ends_a_wait_with_cancelled() {
    let semaphore = Semaphore::new(1);
    let token = CancellationToken::new();
    let _held = semaphore.try_acquire().unwrap();
    let waiter_token = CancellationToken::new();
    let mut waiter = tokio_test::task::spawn(semaphore.acquire(&waiter_token));
    assert_pending!(waiter.poll());
    waiter_token.cancel();
    assert!(waiter.is_woken());
    assert_eq!(
        assert_ready!(waiter.poll()).unwrap_err(),
        AcquireError::Cancelled
    );
    assert!(!token.is_cancelled());
}

#[tokio::test]
async fn close_wakes_every_waiter_with_closed() {
    let semaphore = Semaphore::new(1);
    let token = CancellationToken::new();
    let held = semaphore.try_acquire().unwrap();
    let mut first = tokio_test::task::spawn(semaphore.acquire(&token));
    let mut second = tokio_test::task::spawn(semaphore.acquire_many(&token, 1));
    assert_pending!(first.poll());
    assert_pending!(second.poll());
    semaphore.close();
    assert!(semaphore.is_closed());
    assert!(first.is_woken() && second.is_woken());
    assert_eq!(
        assert_ready!(first.poll()).unwrap_err(),
        AcquireError::Closed
    );
    assert_eq!(
        assert_ready!(second.poll()).unwrap_err(),
        AcquireError::Closed
    );
    assert_eq!(
        semaphore.try_acquire().unwrap_err(),
        TryAcquireError::Closed
    );
    drop(held); // a permit held across the close stays valid and is released normally
}

#[tokio::test]
async fn a_token_cancelled_before_the_call_wins_over_a_free_permit() {
    let semaphore = Semaphore::new(1);
    let token = CancellationToken::new();
    token.cancel();
    assert_eq!(
        semaphore.acquire(&token).await.unwrap_err(),
        AcquireError::Cancelled
    );
    assert_eq!(
        semaphore.acquire_owned(&token).await.unwrap_err(),
        AcquireError::Cancelled
    );
    assert_eq!(semaphore.available(), 1, "no permit was spent");
}

#[tokio::test]
async fn a_waiter_cancelled_before_the_release_gets_cancelled_and_the_permit_goes_on() {
    // golang/go#63615: poll a waiter, cancel its token, release a permit, poll it again.
    for weighted in [false, true] {
        let semaphore = Semaphore::new(2);
        let held = semaphore.try_acquire_many(2).unwrap();
        let token = CancellationToken::new();
        let other = CancellationToken::new();
        let permits = if weighted { 2 } else { 1 };
        let mut first = tokio_test::task::spawn(semaphore.acquire_many(&token, permits));
        let mut second = tokio_test::task::spawn(semaphore.acquire_many(&other, permits));
        assert_pending!(first.poll());
        assert_pending!(second.poll());
        token.cancel();
        drop(held);
        assert_eq!(
            assert_ready!(first.poll()).unwrap_err(),
            AcquireError::Cancelled,
            "weighted: {weighted}"
        );
        assert!(second.is_woken());
        let permit = assert_ready!(second.poll()).unwrap();
        assert_eq!(permit.num_permits(), permits);
        drop(permit);
        assert_eq!((semaphore.available(), semaphore.in_use()), (2, 0));
    }
}

#[tokio::test]
async fn a_permit_released_as_its_waiter_is_cancelled_is_never_lost() {
    let semaphore = Semaphore::new(1);
    let held = semaphore.try_acquire().unwrap();
    let token = CancellationToken::new();
    let mut waiter = tokio_test::task::spawn(semaphore.acquire(&token));
    assert_pending!(waiter.poll());
    // Both happen before the waiter runs again.
    drop(held);
    token.cancel();
    match assert_ready!(waiter.poll()) {
        Ok(permit) => drop(permit),
        Err(error) => assert_eq!(error, AcquireError::Cancelled),
    }
    drop(waiter);
    assert_eq!(semaphore.available(), 1, "the permit came back either way");
}

#[test]
#[should_panic(expected = "capacity must be greater than zero")]
fn zero_capacity_is_a_programmer_error() {
    let _ = Semaphore::new(0);
}

#[tokio::test]
async fn poll_semaphore_waits_in_line_honours_its_token_and_gives_up_its_place_on_drop() {
    use std::future::poll_fn;
    use taskweave_semaphore::PollSemaphore;
    let semaphore = Semaphore::new(1);
    let (token, other) = (CancellationToken::new(), CancellationToken::new());
    let mut first = PollSemaphore::new(semaphore.clone(), token.clone());
    let mut second = PollSemaphore::new(semaphore.clone(), other.clone());
    let mut third = PollSemaphore::new(semaphore.clone(), CancellationToken::new());
    let held = poll_fn(|cx| first.poll_acquire(cx)).await.unwrap();
    let mut waiting = tokio_test::task::spawn(poll_fn(|cx| second.poll_acquire(cx)));
    assert_pending!(waiting.poll());
    drop(waiting);
    // `second` still holds its place (the wait lives in the `PollSemaphore`): `third` queues
    // behind it, and dropping `second` hands its place on.
    let mut behind = tokio_test::task::spawn(poll_fn(|cx| third.poll_acquire(cx)));
    assert_pending!(behind.poll());
    drop(held);
    assert_pending!(behind.poll(), "the permit went to `second`, first in line");
    drop(second);
    assert!(behind.is_woken());
    let permit = assert_ready!(behind.poll()).unwrap();
    drop(behind);
    // A cancelled token ends the next wait with `Cancelled`.
    token.cancel();
    assert_eq!(
        poll_fn(|cx| first.poll_acquire(cx)).await.unwrap_err(),
        AcquireError::Cancelled
    );
    drop(permit);
    assert_eq!((semaphore.available(), semaphore.in_use()), (1, 0));
}

// Issue 20: permit counts are `usize` in every signature, as the capacity is; a request above
// `u32::MAX` (which `acquire_many` could not express) is granted from a large enough semaphore.
#[cfg(target_pointer_width = "64")]
#[tokio::test]
async fn permit_counts_are_usize_like_the_capacity() {
    let many = usize::try_from(u64::from(u32::MAX) + 10).unwrap();
    let semaphore = Semaphore::new(many + 5);
    let permit = semaphore.try_acquire_many(many).unwrap();
    assert_eq!(permit.num_permits(), many);
    assert_eq!(semaphore.available_permits(), 5);
    let token = CancellationToken::new();
    assert!(matches!(
        semaphore.acquire_many(&token, many + 6).await,
        Err(AcquireError::TooLarge { requested, .. }) if requested == many + 6
    ));
    drop(permit);
    assert_eq!(semaphore.available_permits(), many + 5);
}
