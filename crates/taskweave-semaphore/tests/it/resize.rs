//! Live resize: grow and shrink without touching held permits.

use proptest::prelude::*;
use taskweave_semaphore::{AcquireError, Semaphore};
use tokio_test::{assert_pending, assert_ready};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn growing_wakes_waiters() {
    let semaphore = Semaphore::new(1);
    let token = CancellationToken::new();
    let _held = semaphore.try_acquire().unwrap();
    let mut waiter = tokio_test::task::spawn(semaphore.acquire(&token));
    assert_pending!(waiter.poll());
    semaphore.resize(2);
    assert!(waiter.is_woken());
    assert!(assert_ready!(waiter.poll()).is_ok());
}

#[tokio::test]
async fn shrinking_retires_held_permits_as_they_come_back() {
    let semaphore = Semaphore::new(4);
    let held: Vec<_> = (0..4).map(|_| semaphore.try_acquire().unwrap()).collect();
    semaphore.resize(1);
    assert_eq!(
        (
            semaphore.capacity(),
            semaphore.in_use(),
            semaphore.available()
        ),
        (1, 4, 0)
    );
    let mut held = held.into_iter();
    drop(held.next());
    drop(held.next());
    drop(held.next());
    assert_eq!(semaphore.available(), 0, "three permits retired");
    drop(held.next());
    assert_eq!((semaphore.available(), semaphore.in_use()), (1, 0));
}

#[tokio::test]
async fn a_waiter_above_the_new_capacity_fails_with_too_large() {
    let semaphore = Semaphore::new(4);
    let token = CancellationToken::new();
    let _held = semaphore.try_acquire().unwrap();
    let mut waiter = tokio_test::task::spawn(semaphore.acquire_many(&token, 4));
    assert_pending!(waiter.poll());
    semaphore.resize(2);
    assert!(waiter.is_woken());
    assert_eq!(
        assert_ready!(waiter.poll()).unwrap_err(),
        AcquireError::TooLarge {
            requested: 4,
            capacity: 2
        }
    );
    drop(waiter);
    // The permits tokio had assigned to the waiter settle the shrink's debt: no new grant
    // goes past the capacity.
    assert_eq!(
        (
            semaphore.capacity(),
            semaphore.available(),
            semaphore.in_use()
        ),
        (2, 1, 1)
    );
}

#[tokio::test]
async fn a_cancelled_waiter_after_a_shrink_does_not_inflate_the_free_permits() {
    let semaphore = Semaphore::new(3);
    let held = semaphore.try_acquire().unwrap();
    let token = CancellationToken::new();
    let mut waiter = tokio_test::task::spawn(semaphore.acquire_many(&token, 3));
    assert_pending!(waiter.poll()); // holds the 2 free permits while it waits
    semaphore.resize(1);
    token.cancel();
    assert!(assert_ready!(waiter.poll()).is_err());
    drop(waiter);
    assert!(semaphore.available() <= semaphore.capacity());
    drop(held);
    assert_eq!(
        (
            semaphore.available(),
            semaphore.capacity(),
            semaphore.in_use()
        ),
        (1, 1, 0)
    );
}

#[tokio::test]
async fn forgetting_a_permit_under_a_weighted_waiter_fails_it_with_too_large() {
    let semaphore = Semaphore::new(3);
    let token = CancellationToken::new();
    let held = semaphore.try_acquire().unwrap();
    let mut waiter = tokio_test::task::spawn(semaphore.acquire_many(&token, 3));
    assert_pending!(waiter.poll());
    held.forget();
    assert!(waiter.is_woken());
    assert_eq!(
        assert_ready!(waiter.poll()).unwrap_err(),
        AcquireError::TooLarge {
            requested: 3,
            capacity: 2
        }
    );
}

#[tokio::test]
async fn forgetting_the_last_permit_closes_the_semaphore() {
    let semaphore = Semaphore::new(1);
    let token = CancellationToken::new();
    let held = semaphore.try_acquire().unwrap();
    let mut waiter = tokio_test::task::spawn(semaphore.acquire(&token));
    assert_pending!(waiter.poll());
    held.forget();
    assert!(
        waiter.is_woken(),
        "no waiter may wait for a permit that no longer exists"
    );
    assert_eq!(
        assert_ready!(waiter.poll()).unwrap_err(),
        AcquireError::Closed
    );
    assert!(semaphore.is_closed());
}

#[tokio::test]
async fn forgetting_a_permit_shrinks_the_capacity() {
    let semaphore = Semaphore::new(3);
    semaphore.try_acquire().unwrap().forget();
    assert_eq!(
        (
            semaphore.capacity(),
            semaphore.available(),
            semaphore.in_use()
        ),
        (2, 2, 0)
    );
}

#[test]
#[should_panic(expected = "capacity must be greater than zero")]
fn resizing_to_zero_is_a_programmer_error() {
    Semaphore::new(1).resize(0);
}

#[derive(Clone, Debug)]
enum Step {
    Acquire(u32),
    Release(usize),
    Resize(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1_u32..4).prop_map(Step::Acquire),
        (0_usize..8).prop_map(Step::Release),
        (1_usize..8).prop_map(Step::Resize),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    // Whatever the sequence of acquires, releases and resizes: the permits held never exceed
    // what was granted, every permit is accounted for (`in_use` equals the permits held), a
    // grant never exceeds the capacity when it happens, and once everything is released the
    // free permits equal the capacity.
    #[test]
    fn permits_are_conserved_across_resizes(steps in proptest::collection::vec(step(), 0..60)) {
        let semaphore = Semaphore::new(4);
        let mut held = Vec::new();
        for step in steps {
            match step {
                Step::Acquire(n) => {
                    if let Ok(permit) = semaphore.try_acquire_many(n) {
                        prop_assert!(permit.num_permits() as usize <= semaphore.capacity());
                        held.push(permit);
                    }
                }
                Step::Release(i) => {
                    if !held.is_empty() {
                        let index = i % held.len();
                        drop(held.swap_remove(index));
                    }
                }
                Step::Resize(capacity) => semaphore.resize(capacity),
            }
            let holding: usize = held.iter().map(|p| p.num_permits() as usize).sum();
            prop_assert_eq!(semaphore.in_use(), holding);
            prop_assert!(semaphore.available() <= semaphore.capacity());
        }
        held.clear();
        prop_assert_eq!(semaphore.available(), semaphore.capacity());
        prop_assert_eq!(semaphore.in_use(), 0);
    }
}
