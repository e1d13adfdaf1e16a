//! First come, first served: weighted requests are not starved; cancelled waiters hand on.

use taskweave_semaphore::{Semaphore, TryAcquireError};
use tokio_test::{assert_pending, assert_ready};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_large_request_is_not_starved_by_small_ones() {
    let semaphore = Semaphore::new(3);
    let token = CancellationToken::new();
    let a = semaphore.try_acquire().unwrap();
    let b = semaphore.try_acquire().unwrap();
    // Waits for 3 while 1 is free.
    let mut large = tokio_test::task::spawn(semaphore.acquire_many(&token, 3));
    assert_pending!(large.poll());
    // The free permit is already assigned to the large request, so small requests cannot
    // jump the queue: none is free, three are in use (two held, one assigned).
    assert_eq!((semaphore.available(), semaphore.in_use()), (0, 3));
    assert_eq!(
        semaphore.try_acquire().unwrap_err(),
        TryAcquireError::NoPermits
    );
    let mut small = tokio_test::task::spawn(semaphore.acquire(&token));
    assert_pending!(small.poll());
    drop(a);
    drop(b);
    assert!(large.is_woken());
    let large_permit = assert_ready!(large.poll()).unwrap();
    assert_pending!(small.poll(), "served after the large request");
    drop(large_permit);
    assert!(assert_ready!(small.poll()).is_ok());
}

#[tokio::test]
async fn a_cancelled_waiter_at_the_head_wakes_the_ones_behind_it() {
    let semaphore = Semaphore::new(2);
    let held = semaphore.try_acquire().unwrap();
    let head_token = CancellationToken::new();
    let other = CancellationToken::new();
    // The head wants both permits and holds the free one while it waits.
    let mut head = tokio_test::task::spawn(semaphore.acquire_many(&head_token, 2));
    assert_pending!(head.poll());
    let mut behind = tokio_test::task::spawn(semaphore.acquire(&other));
    assert_pending!(behind.poll());
    head_token.cancel();
    assert!(assert_ready!(head.poll()).is_err());
    drop(head);
    assert!(
        behind.is_woken(),
        "the head's permit went on to the next waiter"
    );
    assert!(assert_ready!(behind.poll()).is_ok());
    drop(held);
}
