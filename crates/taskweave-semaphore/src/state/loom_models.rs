//! Loom models of the word and the wait list racing each other: every interleaving, on
//! loom's atomics and mutex. Run with
//! `RUSTFLAGS="--cfg taskweave_loom" cargo test -p taskweave-semaphore --lib`.

use std::task::Waker;

use loom::sync::Arc;
use loom::thread;

use super::{Joined, Polled, State};

/// Nothing held, nothing owed, no flag left behind: the whole capacity is free.
fn assert_settled(state: &State) {
    assert_eq!(state.debt(), 0);
    assert_eq!(state.available(), state.capacity());
    assert_eq!(state.in_use(), 0);
    assert!(state.try_acquire(1).is_ok(), "CONTENDED left set");
}

#[test]
fn a_fast_release_racing_a_waiter_that_joins_is_never_lost() {
    loom::model(|| {
        let state = Arc::new(State::new(1));
        state.try_acquire(1).unwrap();
        let releaser = {
            let state = Arc::clone(&state);
            thread::spawn(move || state.release(1))
        };
        // The waiter found no permit a moment ago and joins now.
        let granted = match state.join(1, Waker::noop()) {
            Joined::Granted => true,
            Joined::Queued(ticket) => {
                releaser.join().unwrap();
                match state.poll_queued(&ticket, Waker::noop()) {
                    Polled::Done(outcome) => outcome.is_ok(),
                    Polled::Pending => panic!("the released permit was lost"),
                }
            }
            Joined::Failed(error) => panic!("{error}"),
        };
        assert!(granted);
        state.release(1);
        assert_settled(&state);
    });
}

#[test]
fn a_shrink_racing_a_release_retires_exactly_what_it_owes() {
    loom::model(|| {
        let state = Arc::new(State::new(2));
        state.try_acquire(2).unwrap();
        let releaser = {
            let state = Arc::clone(&state);
            thread::spawn(move || state.release(1))
        };
        state.resize(|_| 1);
        releaser.join().unwrap();
        // One permit is still held and the capacity is 1: nothing may be free.
        assert_eq!(state.available(), 0);
        assert!(state.try_acquire(1).is_err());
        state.release(1);
        assert_eq!(state.capacity(), 1);
        assert_settled(&state);
    });
}

#[test]
fn an_abandoned_waiter_racing_a_release_hands_the_permit_on() {
    loom::model(|| {
        let state = Arc::new(State::new(1));
        state.try_acquire(1).unwrap();
        let Joined::Queued(ticket) = state.join(1, Waker::noop()) else {
            panic!("nothing was free");
        };
        let releaser = {
            let state = Arc::clone(&state);
            thread::spawn(move || state.release(1))
        };
        // Served or not, the permit must end up free.
        let _served = state.abandon(&ticket);
        releaser.join().unwrap();
        assert_settled(&state);
    });
}

#[test]
fn a_close_racing_a_release_and_a_waiter_fails_the_waiter_and_keeps_the_books() {
    loom::model(|| {
        let state = Arc::new(State::new(1));
        state.try_acquire(1).unwrap();
        let Joined::Queued(ticket) = state.join(1, Waker::noop()) else {
            panic!("nothing was free");
        };
        let closer = {
            let state = Arc::clone(&state);
            thread::spawn(move || state.close())
        };
        state.release(1);
        closer.join().unwrap();
        match state.poll_queued(&ticket, Waker::noop()) {
            // Served before the close: it holds the permit and gives it back.
            Polled::Done(Ok(())) => state.release(1),
            Polled::Done(Err(_closed)) => {}
            Polled::Pending => panic!("the close left a waiter waiting"),
        }
        assert_eq!(state.available(), 1);
        assert!(state.try_acquire(1).is_err(), "closed");
    });
}

#[test]
fn two_fast_releases_racing_a_grow_keep_every_permit() {
    loom::model(|| {
        let state = Arc::new(State::new(2));
        state.try_acquire(2).unwrap();
        let releasers: Vec<_> = (0..2)
            .map(|_| {
                let state = Arc::clone(&state);
                thread::spawn(move || state.release(1))
            })
            .collect();
        state.resize(|old| old + 1);
        releasers.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(state.capacity(), 3);
        assert_settled(&state);
    });
}
