//! Loom models of the compare-and-swap steps: every interleaving of the threads, on loom's
//! atomics. Run with `RUSTFLAGS="--cfg taskweave_loom" cargo test -p taskweave-limit --lib`.
//! (Reservations, cancels and setting changes are serialised by the limiter's lock; what
//! races here is each of them against lock-free checks.)

use loom::sync::Arc;

use super::{Decision, Rate, Tat};

const INTERVAL: u64 = 10;

fn rate(burst: u32) -> Rate {
    Rate {
        interval: INTERVAL,
        burst,
    }
}

#[test]
fn concurrent_checks_grant_exactly_the_burst() {
    loom::model(|| {
        let tat = Arc::new(Tat::default());
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let tat = Arc::clone(&tat);
                loom::thread::spawn(move || matches!(tat.check(0, 1, rate(2)), Decision::Granted))
            })
            .collect();
        let here = matches!(tat.check(0, 1, rate(2)), Decision::Granted);
        let granted = threads
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .filter(|granted| *granted)
            .count()
            + usize::from(here);
        assert_eq!(granted, 2);
        assert_eq!(tat.load(), 2 * INTERVAL);
    });
}

#[test]
fn a_refund_racing_a_check_is_neither_lost_nor_doubled() {
    loom::model(|| {
        // Empty bucket of 1 that owes one more token (a reservation).
        let tat = Arc::new(Tat(super::AtomicU64::new(2 * INTERVAL)));
        let checker = {
            let tat = Arc::clone(&tat);
            loom::thread::spawn(move || matches!(tat.check(0, 1, rate(1)), Decision::Granted))
        };
        tat.refund(0, INTERVAL);
        let granted = checker.join().unwrap();
        // Refund first: the check sees one token freed and takes it (tat back to 2 I);
        // check first: refused, and the refund leaves I.
        let expected = if granted { 2 * INTERVAL } else { INTERVAL };
        assert_eq!(tat.load(), expected);
    });
}

#[test]
fn a_rate_change_during_checks_loses_no_grant() {
    loom::model(|| {
        let tat = Arc::new(Tat::default());
        let checker = {
            let tat = Arc::clone(&tat);
            loom::thread::spawn(move || matches!(tat.check(0, 1, rate(1)), Decision::Granted))
        };
        // Doubling the interval at `now` = 0 doubles what is owed, never drops it.
        tat.rescale(0, INTERVAL, 2 * INTERVAL);
        let granted = checker.join().unwrap();
        assert!(granted, "a single check on a full bucket is granted");
        let owed = tat.load();
        assert!(owed == INTERVAL || owed == 2 * INTERVAL, "owed {owed}");
    });
}

#[test]
fn a_burst_change_racing_a_check_keeps_the_count() {
    loom::model(|| {
        // A full bucket of 1 raised to 3: the one token stays one token.
        let tat = Arc::new(Tat::default());
        let checker = {
            let tat = Arc::clone(&tat);
            loom::thread::spawn(move || matches!(tat.check(0, 1, rate(1)), Decision::Granted))
        };
        tat.reburst(0, INTERVAL, 1, 3);
        let granted = checker.join().unwrap();
        // Check first (old burst): granted, tat I, then shifted to 3 I. Raise first: the
        // check (with the old burst 1) sees tat 2 I and is refused.
        let expected = if granted { 3 * INTERVAL } else { 2 * INTERVAL };
        assert_eq!(tat.load(), expected);
        assert_eq!(
            rate(3).available(tat.load(), 0),
            if granted { 0 } else { 1 }
        );
    });
}
