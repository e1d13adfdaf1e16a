use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio_test::task::{Spawn, spawn};
use tokio_test::{assert_pending, assert_ready, assert_ready_eq};

use super::{Queue, RecvFuture, TryRecvError, TrySendError};

fn full_queue(capacity: u32) -> Queue<u32> {
    let queue = Queue::new(capacity as usize);
    for item in 0..capacity {
        assert!(queue.try_send(item).is_ok());
    }
    queue
}

/// Nobody waits and every wake-up was used or given up: nothing left in the bookkeeping.
fn assert_no_waiters<T>(queue: &Queue<T>) {
    assert_eq!(
        queue.waiters(),
        [0; 4],
        "listed and woken, receivers then senders"
    );
}

/// Two receivers waiting on an empty queue, the first one longest.
fn two_waiting_receivers(
    queue: &Queue<u32>,
) -> (Spawn<RecvFuture<'_, u32>>, Spawn<RecvFuture<'_, u32>>) {
    let mut first = spawn(queue.recv());
    let mut second = spawn(queue.recv());
    assert_pending!(first.poll());
    assert_pending!(second.poll());
    (first, second)
}

#[test]
#[should_panic(expected = "at least one item")]
fn zero_capacity_panics() {
    let _ = Queue::<u32>::new(0);
}

#[test]
fn items_come_out_in_order_and_a_full_queue_refuses() {
    let queue = full_queue(2);
    assert!(matches!(queue.try_send(9), Err(TrySendError::Full(9))));
    assert_eq!(queue.len(), 2);
    assert_eq!(queue.try_recv(), Ok(0));
    assert_eq!(queue.try_recv(), Ok(1));
    assert_eq!(queue.try_recv(), Err(TryRecvError::Empty));
}

#[test]
fn close_refuses_sends_and_lets_receivers_drain() {
    let queue = full_queue(2);
    assert!(queue.close());
    assert!(!queue.close(), "only the first call closes");
    assert!(queue.is_closed());
    assert!(matches!(queue.try_send(9), Err(TrySendError::Closed(9))));
    assert!(matches!(queue.try_send_evicting(9), Err(9)));
    assert_eq!(queue.try_recv(), Ok(0));
    let mut recv = spawn(queue.recv());
    assert_ready_eq!(recv.poll(), Some(1));
    let mut recv = spawn(queue.recv());
    assert_ready_eq!(recv.poll(), None);
    assert_eq!(queue.try_recv(), Err(TryRecvError::Closed));
}

#[test]
fn evicting_send_swaps_the_oldest_for_the_new_item_only_when_full() {
    let queue = Queue::new(2);
    assert_eq!(queue.try_send_evicting(0).ok(), Some(None));
    assert_eq!(queue.try_send_evicting(1).ok(), Some(None));
    assert_eq!(queue.try_send_evicting(2).ok(), Some(Some(0)));
    assert_eq!(queue.drain(), [1, 2]);
}

#[test]
fn a_send_on_a_full_queue_waits_until_a_slot_frees() {
    let queue = full_queue(1);
    let mut send = spawn(queue.send(7));
    assert_pending!(send.poll());
    assert!(!send.is_woken());
    assert_eq!(queue.try_recv(), Ok(0));
    assert!(send.is_woken(), "a freed slot wakes the waiting sender");
    assert_ready!(send.poll()).unwrap_or_else(|_| panic!("the slot is free"));
    assert_eq!(queue.drain(), [7]);
    assert_no_waiters(&queue);
}

#[test]
fn a_recv_on_an_empty_queue_waits_until_an_item_comes() {
    let queue = Queue::new(1);
    let mut recv = spawn(queue.recv());
    assert_pending!(recv.poll());
    assert!(queue.try_send(3).is_ok());
    assert!(recv.is_woken());
    assert_ready_eq!(recv.poll(), Some(3));
    assert_no_waiters(&queue);
}

#[test]
fn close_wakes_every_waiter_and_a_waiting_send_gets_its_item_back() {
    let queue = full_queue(1);
    let mut send = spawn(queue.send(7));
    assert_pending!(send.poll());
    let empty = Queue::<u32>::new(1);
    let mut recv = spawn(empty.recv());
    assert_pending!(recv.poll());
    queue.close();
    empty.close();
    assert!(send.is_woken() && recv.is_woken());
    assert!(matches!(assert_ready!(send.poll()), Err(7)));
    assert_ready_eq!(recv.poll(), None);
}

#[test]
fn into_item_hands_back_an_unsent_item_and_nothing_for_a_sent_one() {
    let queue = full_queue(1);
    let mut waiting = spawn(queue.send(7));
    assert_pending!(waiting.poll());
    assert_eq!(waiting.into_inner().into_item(), Some(7));
    assert_eq!(queue.try_recv(), Ok(0));
    let mut sent = spawn(queue.send(8));
    assert_ready!(sent.poll()).unwrap_or_else(|_| panic!("the slot is free"));
    assert_eq!(sent.into_inner().into_item(), None);
    assert_no_waiters(&queue);
}

#[test]
fn a_woken_receiver_that_is_dropped_passes_its_turn_on() {
    let queue = Queue::new(2);
    let (first, mut second) = two_waiting_receivers(&queue);
    assert!(queue.try_send(1).is_ok());
    assert!(
        first.is_woken() && !second.is_woken(),
        "the longest waiter goes first"
    );
    drop(first);
    assert!(
        second.is_woken(),
        "the unused turn went to the next receiver"
    );
    assert_ready_eq!(second.poll(), Some(1));
    assert_no_waiters(&queue);
}

#[test]
fn a_woken_sender_that_is_dropped_passes_its_turn_on() {
    let queue = full_queue(1);
    let mut first = spawn(queue.send(1));
    let mut second = spawn(queue.send(2));
    assert_pending!(first.poll());
    assert_pending!(second.poll());
    assert_eq!(queue.try_recv(), Ok(0));
    assert!(first.is_woken() && !second.is_woken());
    drop(first);
    assert!(second.is_woken());
    assert_ready!(second.poll()).unwrap_or_else(|_| panic!("the slot is free"));
    assert_eq!(queue.drain(), [2]);
    assert_no_waiters(&queue);
}

#[test]
fn a_dropped_waiter_that_was_not_woken_wakes_nobody() {
    let queue = Queue::<u32>::new(1);
    let (first, second) = two_waiting_receivers(&queue);
    drop(first);
    assert!(!second.is_woken());
    assert!(queue.try_send(1).is_ok());
    assert!(second.is_woken(), "the dropped waiter left the list");
}

#[test]
fn a_woken_waiter_whose_turn_was_taken_waits_at_the_front_again() {
    let queue = Queue::new(2);
    let (mut first, second) = two_waiting_receivers(&queue);
    assert!(queue.try_send(1).is_ok());
    assert!(first.is_woken());
    // A newcomer takes the item before the woken receiver runs.
    assert_eq!(queue.try_recv(), Ok(1));
    assert_pending!(first.poll());
    assert!(queue.try_send(2).is_ok());
    assert!(first.is_woken(), "it waited longest, so it is woken first");
    assert!(!second.is_woken());
    assert_ready_eq!(first.poll(), Some(2));
    drop(second);
    assert_no_waiters(&queue);
}

#[test]
fn waiters_woken_before_a_close_leave_no_bookkeeping_behind() {
    let queue = Queue::new(1);
    let (first, mut second) = two_waiting_receivers(&queue);
    assert!(queue.try_send(1).is_ok());
    assert!(first.is_woken(), "woken for the item");
    assert!(queue.close());
    assert!(second.is_woken(), "woken by the close");
    // One gets the item, both then see the end; a dropped one leaves nothing behind either.
    assert_ready_eq!(second.poll(), Some(1));
    drop(first);
    assert_no_waiters(&queue);
    let full = full_queue(1);
    let mut send = spawn(full.send(2));
    assert_pending!(send.poll());
    assert_eq!(full.try_recv(), Ok(0));
    assert!(send.is_woken());
    assert!(full.close());
    assert!(matches!(assert_ready!(send.poll()), Err(2)));
    assert_no_waiters(&full);
}

#[test]
fn drain_wakes_as_many_senders_as_it_frees_slots() {
    let queue = full_queue(2);
    let mut senders: Vec<_> = (10..13).map(|item| spawn(queue.send(item))).collect();
    for sender in &mut senders {
        assert_pending!(sender.poll());
    }
    assert_eq!(queue.drain(), [0, 1]);
    let woken: Vec<bool> = senders.iter().map(|sender| sender.is_woken()).collect();
    assert_eq!(woken, [true, true, false]);
}

#[test]
fn poll_recv_and_leave_recv_serve_an_owner_that_is_not_a_future() {
    let queue = Queue::<u32>::new(1);
    let mut first = None;
    let mut second = spawn(queue.recv());
    let mut owner = spawn(std::future::poll_fn(|cx| {
        let _ = queue.poll_recv(&mut first, cx);
        std::task::Poll::Ready(())
    }));
    assert_ready!(owner.poll());
    assert!(first.is_some(), "the owner waits in the list");
    assert_pending!(second.poll());
    assert!(queue.try_send(1).is_ok());
    queue.leave_recv(&mut first);
    assert!(first.is_none());
    assert!(second.is_woken(), "the owner's unused turn went on");
}

#[test]
fn poll_recv_all_takes_every_item_and_wakes_as_many_senders() {
    let queue = full_queue(2);
    let mut senders: Vec<_> = (10..13).map(|item| spawn(queue.send(item))).collect();
    for sender in &mut senders {
        assert_pending!(sender.poll());
    }
    let mut waiter = None;
    let mut taken = VecDeque::new();
    let mut owner = spawn(poll_fn(|cx| {
        queue.poll_recv_all(&mut waiter, cx, &mut taken)
    }));
    assert_ready!(owner.poll());
    let woken: Vec<bool> = senders.iter().map(|sender| sender.is_woken()).collect();
    assert_eq!(woken, [true, true, false]);
    drop(senders);
    // Both items were taken: it waits now, and an item wakes it.
    assert_pending!(owner.poll());
    assert!(queue.try_send(5).is_ok());
    assert!(owner.is_woken());
    assert_ready!(owner.poll());
    // Closed and empty: ready with nothing added.
    queue.close();
    assert_ready!(owner.poll());
    drop(owner);
    assert_eq!(taken, [0, 1, 5]);
    assert!(waiter.is_none(), "a ready poll leaves the list");
    assert_no_waiters(&queue);
}

/// Producers and consumers on several threads, consumers giving up their wait now and then:
/// every item is received exactly once and nobody is left waiting.
#[test]
fn every_item_arrives_once_across_threads_with_abandoned_waits() {
    const PRODUCERS: u64 = 3;
    const ITEMS: u64 = 20_000;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let queue = Arc::new(Queue::<u64>::new(4));
        let sum = Arc::new(AtomicU64::new(0));
        let count = Arc::new(AtomicU64::new(0));
        let mut consumers = Vec::new();
        for consumer in 0..3_u64 {
            let queue = Arc::clone(&queue);
            let sum = Arc::clone(&sum);
            let count = Arc::clone(&count);
            consumers.push(tokio::spawn(async move {
                let mut polls = 0_u64;
                loop {
                    polls += 1;
                    // Every few waits, give up after one yield: a dropped `Recv`.
                    let item = if (polls + consumer).is_multiple_of(5) {
                        tokio::select! {
                            biased;
                            item = queue.recv() => item,
                            () = tokio::task::yield_now() => continue,
                        }
                    } else {
                        queue.recv().await
                    };
                    let Some(item) = item else { break };
                    sum.fetch_add(item, Ordering::Relaxed);
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        let mut producers = Vec::new();
        for producer in 0..PRODUCERS {
            let queue = Arc::clone(&queue);
            producers.push(tokio::spawn(async move {
                for item in (0..ITEMS).filter(|item| item % PRODUCERS == producer) {
                    if item.is_multiple_of(7) {
                        // A send abandoned after one yield, then sent again.
                        let mut send = queue.send(item);
                        let sent = tokio::select! {
                            biased;
                            sent = &mut send => Some(sent),
                            () = tokio::task::yield_now() => None,
                        };
                        match sent {
                            Some(sent) => assert!(sent.is_ok()),
                            None => {
                                let item = send.into_item().expect("not sent");
                                assert!(queue.send(item).await.is_ok());
                            }
                        }
                    } else {
                        assert!(queue.send(item).await.is_ok());
                    }
                }
            }));
        }
        for producer in producers {
            producer.await.expect("producer");
        }
        // Every item must be taken before the close, which would wake a receiver whose
        // wake-up was lost. A bound on the wait instead of a clock: a lost wake-up fails here
        // rather than hanging.
        let mut yields = 0_u64;
        while count.load(Ordering::Relaxed) < ITEMS {
            yields += 1;
            assert!(
                yields < 50_000_000,
                "items left in the queue with receivers asleep: a lost wake-up"
            );
            tokio::task::yield_now().await;
        }
        queue.close();
        for consumer in consumers {
            consumer.await.expect("consumer");
        }
        assert_eq!(count.load(Ordering::Relaxed), ITEMS);
        assert_no_waiters(&queue);
        assert_eq!(sum.load(Ordering::Relaxed), ITEMS * (ITEMS - 1) / 2);
    });
}

// Issue 20: a cancelled waiter used to be found by a walk of the list; the list is now linked
// through a slab. Whatever waiters leave, and in whatever order, the others keep their order
// and nothing is left behind.
#[test]
fn senders_that_leave_from_anywhere_keep_the_others_in_order() {
    let queue = full_queue(1);
    let mut senders: Vec<_> = (100..164).map(|item| spawn(queue.send(item))).collect();
    for sender in &mut senders {
        assert_pending!(sender.poll());
    }
    // Every third one gives up (a cancelled submit), from the middle, both ends, in a scramble.
    let mut kept = Vec::new();
    for (at, sender) in senders.into_iter().enumerate() {
        if at % 3 == 1 || at == 0 || at == 63 {
            drop(sender);
        } else {
            kept.push(sender);
        }
    }
    // The rest are served in the order they came, one per freed slot.
    let mut received = Vec::new();
    assert_eq!(queue.try_recv(), Ok(0));
    for sender in &mut kept {
        assert!(sender.is_woken(), "woken in arrival order");
        assert!(assert_ready!(sender.poll()).is_ok());
        received.push(queue.try_recv().unwrap());
    }
    let expected: Vec<u32> = (100..164)
        .enumerate()
        .filter(|(at, _)| !(at % 3 == 1 || *at == 0 || *at == 63))
        .map(|(_, item)| item)
        .collect();
    assert_eq!(received, expected);
    drop(kept);
    assert_no_waiters(&queue);
}

#[test]
fn ten_thousand_waiters_cancelled_at_once_leave_an_empty_list() {
    let queue = full_queue(1);
    let mut senders: Vec<_> = (0..10_000).map(|item| spawn(queue.send(item))).collect();
    for sender in &mut senders {
        assert_pending!(sender.poll());
    }
    assert_eq!(queue.waiters(), [0, 0, 10_000, 0]);
    // Dropped newest first: the order a walk from the front handled worst.
    while let Some(sender) = senders.pop() {
        drop(sender);
    }
    assert_no_waiters(&queue);
    // The slots are reused by new waiters without confusion.
    let mut late = spawn(queue.send(7));
    assert_pending!(late.poll());
    assert_eq!(queue.try_recv(), Ok(0));
    assert!(late.is_woken());
    assert!(assert_ready!(late.poll()).is_ok());
    assert_no_waiters(&queue);
}

#[test]
fn a_batch_send_queues_what_fits_and_wakes_one_receiver_per_item() {
    let queue = Queue::new(3);
    let (mut first, mut second) = two_waiting_receivers(&queue);
    let mut third = spawn(queue.recv());
    assert_pending!(third.poll());
    let mut items: VecDeque<u32> = (0..5).collect();
    assert_eq!(queue.try_send_many(&mut items), Ok(3));
    assert_eq!(items, [3, 4], "the rest stays with the caller, in order");
    // Three items, three receivers woken; a batch of one wakes one.
    assert!(first.is_woken() && second.is_woken() && third.is_woken());
    assert_ready_eq!(first.poll(), Some(0));
    assert_ready_eq!(second.poll(), Some(1));
    assert_ready_eq!(third.poll(), Some(2));
    assert_eq!(queue.try_send_many(&mut items), Ok(2));
    assert!(items.is_empty());
    assert_eq!(queue.try_send_many(&mut items), Ok(0), "an empty batch");
    assert_no_waiters(&queue);
    queue.close();
    let mut late: VecDeque<u32> = [9].into();
    assert_eq!(queue.try_send_many(&mut late), Err(()));
    assert_eq!(late, [9], "a closed queue takes nothing");
}

#[test]
fn an_evicting_batch_send_takes_out_the_oldest_its_own_included() {
    let queue = Queue::new(3);
    assert!(queue.try_send(100).is_ok());
    let evicted = queue.try_send_many_evicting(vec![0, 1, 2, 3]).ok().unwrap();
    assert_eq!(
        evicted,
        [100, 0],
        "what was queued first, then the batch's own first"
    );
    assert_eq!(queue.len(), 3);
    assert_eq!(queue.try_recv(), Ok(1));
    queue.close();
    assert_eq!(
        queue.try_send_many_evicting(vec![7, 8]).err(),
        Some(vec![7, 8])
    );
}

#[test]
fn a_share_is_the_receivers_part_of_the_queue_and_wakes_one_sender_per_item() {
    let queue = full_queue(8);
    let mut senders: Vec<_> = (100..103).map(|item| spawn(queue.send(item))).collect();
    for sender in &mut senders {
        assert_pending!(sender.poll());
    }
    let mut held = VecDeque::new();
    // Eight queued, three other receivers: a quarter, two items.
    assert_eq!(queue.try_recv_share(3, 16, &mut held), Ok(2));
    assert_eq!(held, [0, 1]);
    assert!(senders[0].is_woken() && senders[1].is_woken());
    assert!(!senders[2].is_woken(), "two items out, two senders woken");
    assert_ready_eq!(senders[0].poll(), Ok(()));
    assert_ready_eq!(senders[1].poll(), Ok(()));
    // Capped by `max`, and never less than one.
    held.clear();
    assert_eq!(queue.try_recv_share(0, 3, &mut held), Ok(3));
    assert_eq!(held, [2, 3, 4]);
    assert_ready_eq!(senders[2].poll(), Ok(()));
    held.clear();
    assert_eq!(queue.try_recv_share(100, 3, &mut held), Ok(1));
    while queue.try_recv().is_ok() {}
    assert_eq!(
        queue.try_recv_share(0, 3, &mut held),
        Err(TryRecvError::Empty)
    );
    queue.close();
    assert_eq!(
        queue.try_recv_share(0, 3, &mut held),
        Err(TryRecvError::Closed)
    );
    assert_no_waiters(&queue);
}

/// A queue of four that, once full, takes nothing until it has drained to one item.
fn held_queue() -> Queue<u32> {
    let queue = Queue::with_resume_at(4, 1);
    for item in 0..4 {
        assert!(queue.try_send(item).is_ok());
    }
    queue
}

#[test]
fn a_full_queue_with_resume_at_takes_nothing_until_it_has_drained_to_it() {
    let queue = held_queue();
    let mut send = spawn(queue.send(9));
    let mut other = spawn(queue.send(10));
    assert_pending!(send.poll());
    assert_pending!(other.poll());
    assert_eq!(queue.try_recv(), Ok(0));
    assert_eq!(queue.try_recv(), Ok(1));
    assert_eq!(queue.len(), 2);
    assert!(!send.is_woken(), "two items queued: still above resume_at");
    assert!(matches!(queue.try_send(8), Err(TrySendError::Full(8))));
    let mut batch = VecDeque::from([7, 6]);
    assert_eq!(queue.try_send_many(&mut batch), Ok(0));
    assert_pending!(send.poll());
    assert_eq!(queue.try_recv(), Ok(2));
    assert!(
        send.is_woken() && other.is_woken(),
        "drained to one by a single take: both waiting senders resume (room for three)"
    );
    assert_ready_eq!(send.poll(), Ok(()));
    assert_ready_eq!(other.poll(), Ok(()));
    drop((send, other));
    // Room for one more: the batch fills the queue, and it holds once more.
    assert_eq!(queue.try_send_many(&mut batch), Ok(1));
    assert!(matches!(queue.try_send(5), Err(TrySendError::Full(5))));
    assert_eq!(queue.try_recv(), Ok(3));
    assert!(
        matches!(queue.try_send(5), Err(TrySendError::Full(5))),
        "three queued after a refill: held again"
    );
    assert_eq!(
        std::iter::from_fn(|| queue.try_recv().ok()).collect::<Vec<_>>(),
        [9, 10, 7]
    );
    assert!(queue.try_send(5).is_ok(), "drained: room again");
    assert_no_waiters(&queue);
}

#[test]
fn resuming_wakes_as_many_senders_as_there_is_room_for_and_a_quitter_passes_its_turn_on() {
    let queue = Queue::with_resume_at(2, 0);
    assert!(queue.try_send(0_u32).is_ok());
    assert!(queue.try_send(1).is_ok());
    let mut first = spawn(queue.send(10));
    let mut second = spawn(queue.send(11));
    let mut third = spawn(queue.send(12));
    for send in [&mut first, &mut second, &mut third] {
        assert_pending!(send.poll());
    }
    let mut taken = VecDeque::new();
    assert_eq!(queue.try_recv_share(0, 8, &mut taken), Ok(2));
    assert!(first.is_woken() && second.is_woken(), "room for two");
    assert!(!third.is_woken(), "no room for the third");
    drop(first);
    assert!(
        third.is_woken(),
        "the first gave its turn up: the third gets it"
    );
    assert_ready_eq!(second.poll(), Ok(()));
    assert_ready_eq!(third.poll(), Ok(()));
    drop((second, third));
    assert!(matches!(queue.try_send(13), Err(TrySendError::Full(13))));
    assert_eq!(queue.drain(), [11, 12]);
    assert_no_waiters(&queue);
}

#[test]
#[should_panic(expected = "resumes below its capacity")]
fn resume_at_the_capacity_panics() {
    let _ = Queue::<u32>::with_resume_at(2, 2);
}
