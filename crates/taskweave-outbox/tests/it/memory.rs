//! The in-memory store's own rules: bad input, transactions.

use taskweave_outbox::{EnqueueError, Event, InvalidEvent, Limits, MemoryStore};

#[test]
fn bad_input_is_refused_with_a_typed_error_and_nothing_is_written() {
    let store = MemoryStore::new(8).with_limits(Limits {
        max_payload_bytes: 10,
        max_key_bytes: 4,
        max_headers: 1,
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
