//! The in-memory store's own rules: bad input, transactions.

use taskweave_outbox::{EnqueueError, Event, InvalidEvent, Limits, MemoryStore};

#[test]
fn bad_input_is_refused_with_a_typed_error_and_nothing_is_written() {
    let store = MemoryStore::new(8).with_limits(Limits {
        max_payload_bytes: 10,
        max_key_bytes: 4,
        max_headers: 1,
        max_header_bytes: 6,
    });
    let cases = [
        (Event::new("", "k", b"x".to_vec()), InvalidEvent::EmptyTopic),
        (
            Event::new("a topic", "k", b"x".to_vec()),
            InvalidEvent::InvalidTopic("a topic".into()),
        ),
        (Event::new("t", "", b"x".to_vec()), InvalidEvent::EmptyKey),
        (
            Event::new("t", "kkkkk", b"x".to_vec()),
            InvalidEvent::KeyTooLong { len: 5, limit: 4 },
        ),
        (
            Event::new("t", "k", vec![0; 11]),
            InvalidEvent::PayloadTooLarge { len: 11, limit: 10 },
        ),
        (
            Event::new("t", "k", b"x".to_vec())
                .with_header("a", "1")
                .with_header("b", "2"),
            InvalidEvent::TooManyHeaders { count: 2, limit: 1 },
        ),
        (
            Event::new("t", "k", b"x".to_vec()).with_header("event_id", "forged"),
            InvalidEvent::ReservedHeader("event_id".into()),
        ),
        (
            Event::new("t", "k", b"x".to_vec()).with_header("name", "val"),
            InvalidEvent::HeadersTooLarge { len: 7, limit: 6 },
        ),
    ];
    for (event, expected) in cases {
        match store.enqueue(event) {
            Err(EnqueueError::Invalid { index: 0, reason }) => assert_eq!(reason, expected),
            other => panic!("expected {expected:?}, got {other:?}"),
        }
    }
    assert_eq!(store.pending(), 0);
    // At the limits exactly, it is accepted.
    store
        .enqueue(Event::new("t", "kkkk", vec![0; 10]).with_header("a", "1"))
        .unwrap();
    assert_eq!(store.pending(), 1);
}

#[test]
fn a_dropped_transaction_writes_nothing() {
    let store = MemoryStore::new(8);
    let mut tx = store.begin();
    tx.enqueue(Event::new("t", "k", b"x".to_vec())).unwrap();
    drop(tx);
    assert_eq!(store.pending(), 0);
}

#[test]
#[should_panic(expected = "greater than zero")]
fn zero_buckets_is_a_programmer_error() {
    let _ = MemoryStore::new(0);
}

#[test]
fn errors_read_well() {
    let error = EnqueueError::Invalid {
        index: 2,
        reason: InvalidEvent::PayloadTooLarge { len: 11, limit: 10 },
    };
    assert_eq!(
        error.to_string(),
        "event 2 refused: payload of 11 bytes over the limit of 10"
    );
    assert!(std::error::Error::source(&error).is_some());
}

#[tokio::test(start_paused = true)]
async fn polls_come_quickly_after_work_and_back_off_to_the_interval_when_idle() {
    use std::time::Duration;
    use taskweave_outbox::{MemoryPublisher, Relay};
    use tokio_util::sync::CancellationToken;

    let store = MemoryStore::new(8);
    store.enqueue(Event::new("t", "k", b"x".to_vec())).unwrap();
    let token = CancellationToken::new();
    let relay = Relay::new(store.clone(), MemoryPublisher::new())
        .with_poll_interval(Duration::from_millis(800))
        .with_min_poll_interval(Duration::from_millis(100));
    let metrics = relay.metrics();
    let running = tokio::spawn(relay.run(token.clone()));
    // One batch at 0, then empty polls at 0, 100, 300, 700 and 1500 ms (waits of 100, 200,
    // 400, then the 800 ms interval); a fixed interval would have polled at 0 and 800 only.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let m = metrics.snapshot();
    assert_eq!((m.batches, m.empty_polls), (1, 5), "{m:?}");
    // Idle from the start (no work yet), a relay polls at the interval.
    token.cancel();
    running.await.unwrap();
    let idle = MemoryStore::new(8);
    let token = CancellationToken::new();
    let relay = Relay::new(idle, MemoryPublisher::new())
        .with_poll_interval(Duration::from_millis(800))
        .with_min_poll_interval(Duration::from_millis(100));
    let metrics = relay.metrics();
    let running = tokio::spawn(relay.run(token.clone()));
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(metrics.snapshot().empty_polls, 3, "at 0, 800 and 1600 ms");
    token.cancel();
    let report = running.await.unwrap();
    assert_eq!(report.left.map(|left| left.pending), Some(0));
}
