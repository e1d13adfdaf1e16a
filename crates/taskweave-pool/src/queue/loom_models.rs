//! Loom models of the queue's wake-ups: every interleaving of the lock, a lost wake-up shows
//! as a deadlock (a thread parked for ever). Run with
//! `RUSTFLAGS="--cfg taskweave_loom" cargo test -p taskweave-pool --lib --release`.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use loom::future::block_on;
use loom::sync::Arc;
use loom::thread;

use super::{Queue, TryRecvError};

/// Polls `future` once with a waker that does nothing, then drops it: a waiter that gives
/// up, possibly after it was woken.
fn poll_once_then_drop<F: Future>(future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

/// A thread that sends 0 and 1, waiting for room each time, then closes the queue if asked.
fn send_two(queue: &Arc<Queue<u32>>, then_close: bool) -> thread::JoinHandle<()> {
    let queue = Arc::clone(queue);
    thread::spawn(move || {
        for item in 0..2 {
            assert!(block_on(queue.send(item)).is_ok());
        }
        if then_close {
            queue.close();
        }
    })
}

/// A sender and a receiver through a queue of one: each waits for the other in turn.
#[test]
fn a_sender_and_a_receiver_hand_items_over_without_losing_a_wake_up() {
    loom::model(|| {
        let queue = Arc::new(Queue::new(1));
        let sender = send_two(&queue, false);
        assert_eq!(block_on(queue.recv()), Some(0));
        assert_eq!(block_on(queue.recv()), Some(1));
        sender.join().unwrap();
    });
}

/// A receiver that may be woken for the one item and then gives up: its turn must reach the
/// other receiver, which otherwise sleeps beside the item.
#[test]
fn a_receiver_that_gives_up_passes_its_wake_up_on() {
    loom::model(|| {
        let queue = Arc::new(Queue::<u32>::new(1));
        let quitter = {
            let queue = Arc::clone(&queue);
            thread::spawn(move || poll_once_then_drop(queue.recv()).flatten())
        };
        let waiter = {
            let queue = Arc::clone(&queue);
            thread::spawn(move || block_on(queue.recv()))
        };
        assert!(queue.try_send(7).is_ok());
        let quitter_got = quitter.join().unwrap();
        if quitter_got.is_some() {
            // Nothing left for the other one: release it.
            queue.close();
        }
        let waiter_got = waiter.join().unwrap();
        assert_eq!(
            usize::from(quitter_got.is_some()) + usize::from(waiter_got.is_some()),
            1,
            "the item reached exactly one receiver"
        );
        assert_eq!(queue.waiters(), [0; 4]);
    });
}

/// A sender that may be woken for the one free slot and then gives up: its turn must reach
/// the other sender, which otherwise sleeps beside the free slot.
#[test]
fn a_sender_that_gives_up_passes_its_wake_up_on() {
    loom::model(|| {
        let queue = Arc::new(Queue::new(1));
        assert!(queue.try_send(0_u32).is_ok());
        let quitter = {
            let queue = Arc::clone(&queue);
            thread::spawn(move || {
                poll_once_then_drop(queue.send(1)).is_some_and(|sent| sent.is_ok())
            })
        };
        let waiter = {
            let queue = Arc::clone(&queue);
            thread::spawn(move || block_on(queue.send(2)).is_ok())
        };
        assert_eq!(queue.try_recv(), Ok(0));
        if quitter.join().unwrap() {
            // The quitter took the slot: free another one for the waiter.
            assert_eq!(queue.try_recv(), Ok(1));
        }
        assert!(waiter.join().unwrap());
        assert_eq!(queue.drain(), [2]);
        assert_eq!(queue.waiters(), [0; 4]);
    });
}

/// A sender fills a queue of one twice and closes it while the receiver takes everything in
/// batches: every item arrives, and the end comes only after the last one.
#[test]
fn batches_get_every_item_then_the_end_despite_a_racing_close() {
    loom::model(|| {
        let queue = Arc::new(Queue::new(1));
        let sender = send_two(&queue, true);
        let mut waiter = None;
        let mut taken = VecDeque::new();
        loop {
            let before = taken.len();
            block_on(poll_fn(|cx| {
                queue.poll_recv_all(&mut waiter, cx, &mut taken)
            }));
            if taken.len() == before {
                break;
            }
        }
        assert_eq!(taken, [0, 1]);
        assert_eq!(queue.waiters(), [0; 4]);
        sender.join().unwrap();
    });
}

/// Two threads that each wait for one item of `queue`.
fn two_waiting_receivers(queue: &Arc<Queue<u32>>) -> [thread::JoinHandle<Option<u32>>; 2] {
    [(); 2].map(|()| {
        let queue = Arc::clone(queue);
        thread::spawn(move || block_on(queue.recv()))
    })
}

/// What the receivers got, one item each, sorted.
fn one_item_each_sorted(receivers: [thread::JoinHandle<Option<u32>>; 2]) -> Vec<u32> {
    let mut got: Vec<u32> = receivers
        .into_iter()
        .map(|receiver| receiver.join().unwrap().expect("an item for each receiver"))
        .collect();
    got.sort_unstable();
    got
}

/// Two receivers wait on an empty queue and one batch of two arrives: the batch wakes both
/// (waking one would leave the other asleep beside its item for ever).
#[test]
fn a_batch_send_wakes_every_receiver_it_feeds() {
    loom::model(|| {
        let queue = Arc::new(Queue::<u32>::new(2));
        let receivers = two_waiting_receivers(&queue);
        let mut batch = VecDeque::from([0, 1]);
        assert_eq!(queue.try_send_many(&mut batch), Ok(2));
        assert!(batch.is_empty());
        let got = one_item_each_sorted(receivers);
        assert_eq!(got, [0, 1]);
        assert_eq!(queue.waiters(), [0; 4]);
    });
}

/// Two senders wait on a full queue of two and one receiver takes both items as its share:
/// the share wakes both senders (waking one would leave the other asleep beside a free
/// slot for ever).
#[test]
fn a_share_wakes_as_many_senders_as_it_frees() {
    loom::model(|| {
        let queue = Arc::new(Queue::new(2));
        let mut full = VecDeque::from([0_u32, 1]);
        assert_eq!(queue.try_send_many(&mut full), Ok(2));
        let senders: Vec<_> = [2_u32, 3]
            .into_iter()
            .map(|item| {
                let queue = Arc::clone(&queue);
                thread::spawn(move || block_on(queue.send(item)).is_ok())
            })
            .collect();
        let mut held = VecDeque::new();
        assert_eq!(queue.try_recv_share(0, 2, &mut held), Ok(2));
        assert_eq!(held, [0, 1]);
        for sender in senders {
            assert!(sender.join().unwrap(), "each sender found room");
        }
        let mut rest = queue.drain();
        rest.sort_unstable();
        assert_eq!(rest, [2, 3]);
        assert_eq!(queue.waiters(), [0; 4]);
    });
}

/// `submit_many`'s loop against a worker's: the sender queues what fits (two), waits for
/// room for the third, and closes; the receiver takes shares of up to two and waits when the
/// queue is empty. Every item arrives once, in order, before the end. (A queue of two and
/// three items: with more, the sender waits more than once and the model takes minutes.)
#[test]
fn a_batch_sender_and_a_sharing_receiver_lose_no_wake_up() {
    loom::model(|| {
        let queue = Arc::new(Queue::new(2));
        let sender = {
            let queue = Arc::clone(&queue);
            thread::spawn(move || {
                let mut batch = VecDeque::from([0_u32, 1, 2]);
                loop {
                    assert!(queue.try_send_many(&mut batch).is_ok());
                    let Some(next) = batch.pop_front() else {
                        break;
                    };
                    assert!(block_on(queue.send(next)).is_ok());
                }
                queue.close();
            })
        };
        let mut got = VecDeque::new();
        loop {
            match queue.try_recv_share(0, 2, &mut got) {
                Ok(_) => {}
                Err(TryRecvError::Closed) => break,
                Err(TryRecvError::Empty) => match block_on(queue.recv()) {
                    Some(item) => got.push_back(item),
                    None => break,
                },
            }
        }
        assert_eq!(got, [0, 1, 2]);
        assert_eq!(queue.waiters(), [0; 4]);
        sender.join().unwrap();
    });
}

/// Two receivers wait on an empty queue of two and a batch of three goes in evicting: its
/// own first item is evicted and the other two wake both receivers.
#[test]
fn an_evicting_batch_wakes_every_receiver_it_feeds() {
    loom::model(|| {
        let queue = Arc::new(Queue::<u32>::new(2));
        let receivers = two_waiting_receivers(&queue);
        let evicted = queue.try_send_many_evicting(vec![0, 1, 2]);
        assert_eq!(evicted.ok(), Some(vec![0]));
        let got = one_item_each_sorted(receivers);
        assert_eq!(got, [1, 2]);
        assert_eq!(queue.waiters(), [0; 4]);
    });
}

/// A batch larger than the queue goes in evicting while a close races it and a receiver
/// waits: the batch is either refused whole (handed back) or queued in one step with its
/// own first item evicted, and every item is in exactly one of the three places.
#[test]
fn a_batch_evicting_send_racing_a_close_loses_nothing() {
    loom::model(|| {
        let queue = Arc::new(Queue::new(2));
        let receiver = {
            let queue = Arc::clone(&queue);
            thread::spawn(move || {
                let mut got = Vec::new();
                while let Some(item) = block_on(queue.recv()) {
                    got.push(item);
                }
                got
            })
        };
        let closer = {
            let queue = Arc::clone(&queue);
            thread::spawn(move || assert!(queue.close()))
        };
        let sent = queue.try_send_many_evicting(vec![0_u32, 1, 2]);
        closer.join().unwrap();
        let got = receiver.join().unwrap();
        match sent {
            Ok(evicted) => {
                assert_eq!(evicted, [0]);
                assert_eq!(got, [1, 2]);
            }
            Err(refused) => {
                assert_eq!(refused, [0, 1, 2]);
                assert!(got.is_empty());
            }
        }
        assert_eq!(queue.waiters(), [0; 4]);
    });
}

/// A sender and a receiver through a queue of two that, once full, takes nothing until it is
/// empty: the sender sleeps while the queue drains and must be woken when it is empty.
#[test]
fn a_sender_held_until_the_queue_drains_is_woken_when_it_has() {
    loom::model(|| {
        let queue = Arc::new(Queue::with_resume_at(2, 0));
        let sender = {
            let queue = Arc::clone(&queue);
            thread::spawn(move || {
                for item in 0..3 {
                    assert!(block_on(queue.send(item)).is_ok());
                }
            })
        };
        let received: Vec<u32> = (0..3).map(|_| block_on(queue.recv()).unwrap()).collect();
        assert_eq!(received, [0, 1, 2]);
        sender.join().unwrap();
        assert_eq!(queue.waiters(), [0; 4]);
    });
}
