//! Loom models of the batch channel's wake-ups: every interleaving of the lock and of the
//! count's read-modify-writes; a lost wake-up shows as a deadlock (a thread parked for
//! ever). Run with `RUSTFLAGS="--cfg taskweave_loom" cargo test -p taskweave-supervise --lib
//! --release`.

use std::collections::VecDeque;
use std::future::poll_fn;

use loom::future::block_on;
use loom::thread;

use super::{DEFER_WAKE_ABOVE, Gone, Receiver, Sender, bounded};

/// Sends `items` one push at a time, waiting for room before each.
fn send_each(tx: Sender<u32>, items: Vec<u32>) -> thread::JoinHandle<Result<(), Gone>> {
    thread::spawn(move || {
        for item in items {
            block_on(poll_fn(|cx| tx.poll_room(cx)))?;
            tx.push(&mut VecDeque::from([item]))?;
        }
        Ok(())
    })
}

/// Every interleaving with up to four preemptions (loom's usual bound: the full space of
/// these models takes longer than CI has).
fn bounded_model(model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(4);
    builder.check(model);
}

fn next(rx: &mut Receiver<u32>) -> Option<u32> {
    block_on(poll_fn(|cx| rx.poll_next(cx)))
}

/// Capacity one: the sender waits for the room the first yield gives back, the receiver for
/// each push, and the close after the last item reaches the receiver.
#[test]
fn a_sender_and_a_receiver_of_one_hand_over_two_items_and_the_end() {
    bounded_model(|| {
        let (tx, mut rx) = bounded(1);
        let sender = send_each(tx, vec![0, 1]);
        assert_eq!(next(&mut rx), Some(0));
        assert_eq!(next(&mut rx), Some(1));
        assert_eq!(next(&mut rx), None);
        assert!(sender.join().unwrap().is_ok());
    });
}

/// Capacity two, the sender pushing a batch into whatever room it finds, the receiver
/// taking batches: the count never passes the capacity and no item is lost.
#[test]
fn batches_both_ways_keep_the_count_within_the_capacity() {
    bounded_model(|| {
        let (tx, mut rx) = bounded(2);
        let sender = thread::spawn(move || {
            let mut next = 0;
            while next < 3 {
                let room = block_on(poll_fn(|cx| tx.poll_room(cx))).unwrap();
                let end = (next + u32::try_from(room).unwrap()).min(3);
                let mut batch: VecDeque<u32> = (next..end).collect();
                tx.push(&mut batch).unwrap();
                assert!(tx.len() <= 2);
                next = end;
            }
        });
        let mut got = Vec::new();
        while let Some(item) = block_on(poll_fn(|cx| rx.poll_pop(cx, 2))) {
            got.push(item);
        }
        assert_eq!(got, [0, 1, 2]);
        sender.join().unwrap();
    });
}

/// A receiver that goes away while the sender waits for room: the sender is woken and told.
#[test]
fn a_receiver_dropped_while_the_sender_waits_for_room_releases_it() {
    loom::model(|| {
        let (tx, rx) = bounded(1);
        let sender = send_each(tx, vec![0, 1]);
        drop(rx);
        assert!(sender.join().unwrap().is_err());
    });
}

/// Capacity two: the receiver yields from a buffer of two while the sender waits for the
/// room of one; a yield wakes it, and every item and the end arrive.
#[test]
fn yields_from_a_full_buffer_wake_the_sender_waiting_for_room() {
    bounded_model(|| {
        let (tx, mut rx) = bounded(2);
        let sender = thread::spawn(move || {
            tx.push(&mut VecDeque::from([0, 1])).unwrap();
            block_on(poll_fn(|cx| tx.poll_room(cx))).unwrap();
            tx.push(&mut VecDeque::from([2])).unwrap();
        });
        assert_eq!(next(&mut rx), Some(0));
        assert_eq!(next(&mut rx), Some(1));
        assert_eq!(next(&mut rx), Some(2));
        assert_eq!(next(&mut rx), None);
        sender.join().unwrap();
    });
}

/// Capacity two, a reader that reserves up to two items at a time (a pipeline stage): the
/// room of what it reserved comes back at once, so the sender waiting for it is woken, and
/// every item and the end arrive, in order.
#[test]
fn reserving_pops_give_the_room_back_and_lose_nothing() {
    bounded_model(|| {
        let (tx, mut rx) = bounded(2);
        let sender = send_each(tx, vec![0, 1, 2]);
        let mut got = Vec::new();
        while let Some(item) = block_on(poll_fn(|cx| rx.poll_pop(cx, 2))) {
            got.push(item);
        }
        assert_eq!(got, [0, 1, 2]);
        assert!(sender.join().unwrap().is_ok());
    });
}

/// Capacity one: the reader pops one item, then waits for something the sender does only
/// after its next send: the pop gave the item's room back.
#[test]
fn a_pop_gives_the_room_back_before_the_reader_waits_elsewhere() {
    bounded_model(|| {
        let (tx, mut rx) = bounded(1);
        let (done_tx, done_rx) = loom::sync::mpsc::channel();
        let sender = thread::spawn(move || {
            for item in [0, 1] {
                block_on(poll_fn(|cx| tx.poll_room(cx))).unwrap();
                tx.push(&mut VecDeque::from([item])).unwrap();
            }
            done_tx.send(()).unwrap();
            tx
        });
        assert_eq!(block_on(poll_fn(|cx| rx.poll_pop(cx, 1))), Some(0));
        done_rx.recv().unwrap();
        assert_eq!(rx.len(), 1);
        drop(sender.join().unwrap());
        assert_eq!(block_on(poll_fn(|cx| rx.poll_pop(cx, 1))), Some(1));
        assert_eq!(block_on(poll_fn(|cx| rx.poll_pop(cx, 1))), None);
    });
}

/// A reservation larger than `DEFER_WAKE_ABOVE` that finds the sender waiting owes it a
/// wake-up until `settle`: a reader that settles and then waits for something the sender
/// does after its next push is not stuck.
#[test]
fn a_large_reservation_wakes_the_waiting_sender_at_the_settle() {
    bounded_model(|| {
        let capacity = DEFER_WAKE_ABOVE + 2;
        let (tx, mut rx) = bounded(capacity);
        let (done_tx, done_rx) = loom::sync::mpsc::channel();
        let sender = thread::spawn(move || {
            let mut first: VecDeque<usize> = (0..capacity).collect();
            tx.push(&mut first).unwrap();
            block_on(poll_fn(|cx| tx.poll_room(cx))).unwrap();
            tx.push(&mut VecDeque::from([capacity])).unwrap();
            done_tx.send(()).unwrap();
            tx
        });
        assert_eq!(block_on(poll_fn(|cx| rx.poll_pop(cx, capacity))), Some(0));
        rx.settle();
        done_rx.recv().unwrap();
        drop(sender.join().unwrap());
        let mut rest = Vec::new();
        while let Some(item) = block_on(poll_fn(|cx| rx.poll_pop(cx, capacity))) {
            rest.push(item);
        }
        assert_eq!(rest, (1..=capacity).collect::<Vec<_>>());
    });
}

/// The same without a `settle` by hand: `poll_pop` settles before it refills or waits, so a
/// reader that only pops loses no wake-up either.
#[test]
fn a_large_reservation_owed_wake_up_is_paid_before_the_reader_waits() {
    bounded_model(|| {
        let capacity = DEFER_WAKE_ABOVE + 2;
        let (tx, mut rx) = bounded(capacity);
        let sender = thread::spawn(move || {
            let mut first: VecDeque<usize> = (0..capacity).collect();
            tx.push(&mut first).unwrap();
            block_on(poll_fn(|cx| tx.poll_room(cx))).unwrap();
            tx.push(&mut VecDeque::from([capacity])).unwrap();
        });
        let mut got = Vec::new();
        while let Some(item) = block_on(poll_fn(|cx| rx.poll_pop(cx, capacity))) {
            got.push(item);
        }
        assert_eq!(got, (0..=capacity).collect::<Vec<_>>());
        sender.join().unwrap();
    });
}
