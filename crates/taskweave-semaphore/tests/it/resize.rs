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
    Acquire(usize),
    Release(usize),
    Resize(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1_usize..4).prop_map(Step::Acquire),
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
                        prop_assert!(permit.num_permits() <= semaphore.capacity());
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
            let holding: usize = held.iter().map(|p| p.num_permits()).sum();
            prop_assert_eq!(semaphore.in_use(), holding);
            prop_assert!(semaphore.available() <= semaphore.capacity());
        }
        held.clear();
        prop_assert_eq!(semaphore.available(), semaphore.capacity());
        prop_assert_eq!(semaphore.in_use(), 0);
    }
}

#[test]
fn a_closed_semaphore_says_closed_before_any_size_error() {
    let semaphore = Semaphore::new(2);
    semaphore.close();
    assert_eq!(
        semaphore.try_acquire_many(5).unwrap_err(),
        taskweave_semaphore::TryAcquireError::Closed
    );
    // Forgetting the last permit closes it: later requests see `Closed`, not a bogus
    // `TooLarge { capacity: 0 }`.
    let semaphore = Semaphore::new(1);
    semaphore.try_acquire().unwrap().forget();
    assert_eq!(
        semaphore.try_acquire().unwrap_err(),
        taskweave_semaphore::TryAcquireError::Closed
    );
    let token = CancellationToken::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert_eq!(
        rt.block_on(semaphore.acquire_many(&token, 3)).unwrap_err(),
        AcquireError::Closed
    );
}

#[test]
fn relative_changes_from_two_threads_never_lose_an_update() {
    let semaphore = Semaphore::new(1);
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let semaphore = semaphore.clone();
            std::thread::spawn(move || {
                for _ in 0..1_000 {
                    semaphore.add_permits(1);
                }
            })
        })
        .collect();
    threads
        .into_iter()
        .for_each(|thread| thread.join().unwrap());
    assert_eq!(semaphore.capacity(), 2_001);
    assert_eq!(semaphore.available(), 2_001);
    assert_eq!(semaphore.forget_permits(2_000), 1);
    assert_eq!(semaphore.forget_permits(5), 1, "never below one permit");
    assert_eq!((semaphore.available(), semaphore.in_use()), (1, 0));
}

#[test]
#[should_panic(expected = "Semaphore::add_permits: capacity must be at most")]
fn adding_past_max_permits_is_a_programmer_error() {
    let semaphore = Semaphore::new(Semaphore::MAX_PERMITS);
    semaphore.add_permits(1);
}

#[test]
fn permits_merge_and_split_as_tokio_s_do() {
    let semaphore = Semaphore::new(5);
    let mut permit = semaphore.try_acquire_many(2).unwrap();
    permit.merge(semaphore.try_acquire().unwrap());
    assert_eq!(permit.num_permits(), 3);
    let part = permit.split(2).unwrap();
    assert!(permit.split(5).is_none(), "holds 1");
    assert_eq!((permit.num_permits(), part.num_permits()), (1, 2));
    assert_eq!(semaphore.in_use(), 3);
    drop(part);
    assert_eq!(semaphore.in_use(), 1);
    drop(permit);
    let mut owned = semaphore.try_acquire_owned().unwrap();
    owned.merge(semaphore.try_acquire_many_owned(4).unwrap());
    let split = owned.split(5).unwrap();
    assert_eq!((owned.num_permits(), split.num_permits()), (0, 5));
    drop(split);
    assert_eq!(semaphore.available(), 5);
}

#[test]
#[should_panic(expected = "Permit::merge: the permits are of different semaphores")]
fn merging_permits_of_two_semaphores_is_a_programmer_error() {
    let (a, b) = (Semaphore::new(1), Semaphore::new(1));
    let mut permit = a.try_acquire().unwrap();
    permit.merge(b.try_acquire().unwrap());
}

/// Threads acquire (some weighted, some cancelled), hold and release while another thread
/// shrinks and grows the capacity between `LOW` and `HIGH`: the holders counted by the test
/// never exceed the capacity of the moment at a grant. A grant is checked against the
/// largest capacity the resizer set while it was in flight (the resizer records a
/// generation per change), so a resize racing the check cannot make it fail spuriously.
#[test]
fn resizes_racing_acquires_and_releases_never_admit_more_than_the_capacity() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    const LOW: usize = 2;
    const HIGH: usize = 6;
    let semaphore = Semaphore::new(HIGH);
    let holders = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // (generation, capacity) of every change; a reader takes the max over its window.
    let history = Arc::new(Mutex::new(vec![HIGH]));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let workers: Vec<_> = (0..4_usize)
        .map(|worker| {
            let (semaphore, holders, history) = (
                semaphore.clone(),
                Arc::clone(&holders),
                Arc::clone(&history),
            );
            runtime.spawn(async move {
                for round in 0..2_000_usize {
                    let permits = 1 + (worker + round) % 2;
                    let token = CancellationToken::new();
                    if round % 7 == 0 {
                        token.cancel();
                    }
                    let before = history.lock().unwrap().len();
                    let Ok(permit) = semaphore.acquire_many(&token, permits).await else {
                        continue;
                    };
                    let now = holders.fetch_add(permits, Ordering::SeqCst) + permits;
                    let allowed = history.lock().unwrap()[before - 1..]
                        .iter()
                        .copied()
                        .max()
                        .unwrap();
                    assert!(
                        now <= allowed,
                        "{now} held with a capacity of at most {allowed}"
                    );
                    tokio::task::yield_now().await;
                    holders.fetch_sub(permits, Ordering::SeqCst);
                    drop(permit);
                }
            })
        })
        .collect();
    let resizer = {
        let (semaphore, stop, history) =
            (semaphore.clone(), Arc::clone(&stop), Arc::clone(&history));
        std::thread::spawn(move || {
            let mut capacity = HIGH;
            while !stop.load(Ordering::SeqCst) {
                capacity = if capacity == HIGH { LOW } else { HIGH };
                // Recorded before a grow takes effect and after a shrink does, so the
                // window of any grant covers the capacity it was granted under.
                if capacity > LOW {
                    history.lock().unwrap().push(capacity);
                    semaphore.resize(capacity);
                } else {
                    semaphore.resize(capacity);
                    history.lock().unwrap().push(capacity);
                }
                std::thread::yield_now();
            }
        })
    };
    runtime.block_on(async {
        for worker in workers {
            worker.await.unwrap();
        }
    });
    stop.store(true, Ordering::SeqCst);
    resizer.join().unwrap();
    let capacity = semaphore.capacity();
    assert_eq!((semaphore.in_use(), semaphore.available()), (0, capacity));
}
