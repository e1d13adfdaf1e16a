//! End to end: PostgreSQL through the relay to a real Kafka-protocol broker (tansu), and
//! broker failures injected with rdkafka's mock cluster.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use rdkafka::mocking::MockCluster;
use taskweave_outbox::{
    EnqueueError, Event, InvalidEvent, KafkaPublisher, Limits, Relay, RetryPolicy, StopReason,
    Store,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::support::{self, commit_each, create_topic, fresh_store, kafka_brokers, read_topic};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_reaches_the_broker_once_with_its_headers_in_key_order() {
    let store = fresh_store(64, 6).await;
    let topic = create_topic(3).await;
    let mut committed = Vec::new();
    let mut events = Vec::new();
    for i in 0..300 {
        let key = format!("order-{}", i % 30);
        let payload = format!("{i}");
        committed.push((key.clone().into_bytes(), payload.clone().into_bytes()));
        events.push(
            Event::new(&topic, key, payload.into_bytes()).with_header("content-type", "text/plain"),
        );
    }
    // Batches of transactions, as writers would.
    for chunk in events.chunks(10) {
        let mut tx = store.pool().begin().await.unwrap();
        store.enqueue_batch(&mut tx, chunk.to_vec()).await.unwrap();
        store.commit(tx).await.unwrap();
    }
    let publisher = KafkaPublisher::new(&kafka_brokers()).expect("producer");
    let report = Relay::new(store.clone(), publisher)
        .with_batch_size(100)
        .drain(
            CancellationToken::new(),
            Instant::now() + Duration::from_secs(120),
        )
        .await;
    assert_eq!(report.stopped, StopReason::Drained, "{report}");
    assert_eq!(report.dispatched, 300, "{report}");
    assert_eq!(store.pending().await.unwrap(), 0);

    let consumed =
        tokio::task::spawn_blocking(move || read_topic(&topic, 3, 300, Duration::from_secs(1)))
            .await
            .unwrap();
    assert_eq!(consumed.len(), 300);
    let delivered: Vec<(Vec<u8>, Vec<u8>)> = consumed
        .iter()
        .map(|c| (c.key.clone(), c.payload.clone()))
        .collect();
    // Per key, partition order is delivery order: a key lives on one partition.
    assert_eq!(support::assert_per_key_order(&committed, &delivered), 0);
    let mut partition_of: HashMap<&[u8], i32> = HashMap::new();
    for c in &consumed {
        assert_eq!(
            *partition_of.entry(&c.key).or_insert(c.partition),
            c.partition,
            "a key on two partitions"
        );
        assert_eq!(
            c.headers.last().unwrap(),
            &("content-type".to_owned(), b"text/plain".to_vec())
        );
    }
    let ids: HashSet<&str> = consumed.iter().map(|c| c.event_id.as_str()).collect();
    assert_eq!(ids.len(), 300, "event ids are unique");
    for key in partition_of.keys() {
        let seqs: Vec<i64> = consumed
            .iter()
            .filter(|c| c.key == *key)
            .map(|c| c.sequence)
            .collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "sequences grow per key: {seqs:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_down_longer_than_the_budget_rolls_back_and_the_relay_keeps_going() {
    let (cluster, publisher) = mock_cluster(3, "message.timeout.ms", "400");
    let store = fresh_store(16, 6).await;
    cluster.broker_down(1).expect("broker down");
    let events: Vec<Event> = (0..10)
        .map(|i| Event::new("orders", format!("k{i}"), b"x".to_vec()))
        .collect();
    commit_each(&store, events).await;

    let token = CancellationToken::new();
    let relay = Relay::new(store.clone(), publisher)
        .with_batch_budget(Duration::from_secs(1))
        .with_poll_interval(Duration::from_millis(100));
    let metrics = relay.metrics();
    let running = tokio::spawn(relay.run(token.clone()));
    let start = std::time::Instant::now();
    while metrics.snapshot().retriable_failures < 20 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            metrics.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        store.pending().await.unwrap(),
        10,
        "nothing marked while the broker is down"
    );
    assert!(!running.is_finished(), "the relay keeps running");
    assert_eq!(metrics.snapshot().dispatched, 0);

    cluster.broker_up(1).expect("broker up");
    while store.pending().await.unwrap() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never delivered after the broker came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    token.cancel();
    let report = running.await.unwrap();
    assert!(report.failed >= 20 && report.dispatched == 10, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_broker_refuses_is_parked_at_once_and_holds_only_its_key() {
    let (_cluster, publisher) = mock_cluster(1, "message.max.bytes", "2000");
    let store = fresh_store(1, 6).await;
    commit_each(
        &store,
        vec![
            Event::new("orders", "big", vec![0; 5000]),
            Event::new("orders", "big", b"after".to_vec()),
            Event::new("orders", "small", b"fine".to_vec()),
        ],
    )
    .await;
    let token = CancellationToken::new();
    let relay = Relay::new(store.clone(), publisher).with_poll_interval(Duration::from_millis(50));
    let metrics = relay.metrics();
    let running = tokio::spawn(relay.run(token.clone()));
    let start = std::time::Instant::now();
    while metrics.snapshot().dispatched < 1 || metrics.snapshot().parked < 1 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            metrics.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Polls go on; the parked key is never tried again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    token.cancel();
    let report = running.await.unwrap();
    let m = metrics.snapshot();
    assert_eq!(
        (m.permanent_failures, m.parked, m.retriable_failures),
        (1, 1, 0),
        "a permanent error parks at its first attempt: {m:?}"
    );
    assert_eq!(
        report.dispatched, 1,
        "only the other key went out: {report}"
    );
    let parked = store.parked(10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(
        (parked[0].key.as_slice(), parked[0].attempts),
        (&b"big"[..], 1)
    );
    let error = parked[0].last_error.as_deref().unwrap();
    assert!(
        error.contains("permanent") && error.contains("too large"),
        "{error}"
    );
    let left = report.left.expect("the report counts what was left");
    assert_eq!(
        (left.pending, left.parked, left.behind_parked),
        (0, 1, 1),
        "{report}"
    );
}

/// The largest event the default limits admit (key, payload, header count and header
/// bytes all at their limits) goes out through a producer with librdkafka's default
/// `message.max.bytes`; with one header byte more, `enqueue` refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_event_the_default_limits_admit_is_not_refused_by_a_default_producer() {
    let (_cluster, publisher) = mock_cluster(1, "client.id", "largest-event");
    let store = fresh_store(1, 6).await;
    let limits = Limits::default();
    let largest = |extra: usize| {
        let per_header = limits.max_header_bytes / limits.max_headers;
        let mut event = Event::new(
            "orders",
            vec![b'k'; limits.max_key_bytes],
            vec![7; limits.max_payload_bytes],
        );
        for i in 0..limits.max_headers {
            let name = format!("h{i:02}");
            let extra = if i == 0 { extra } else { 0 };
            event = event.with_header(name.clone(), vec![1; per_header - name.len() + extra]);
        }
        event
    };
    let mut tx = store.pool().begin().await.unwrap();
    match store.enqueue(&mut tx, largest(1)).await {
        Err(EnqueueError::Invalid { reason, .. }) => assert_eq!(
            reason,
            InvalidEvent::HeadersTooLarge {
                len: limits.max_header_bytes + 1,
                limit: limits.max_header_bytes,
            }
        ),
        other => panic!("expected the headers refused, got {other:?}"),
    }
    store
        .enqueue(&mut tx, largest(0))
        .await
        .expect("at the limits");
    store.commit(tx).await.expect("commit");
    let token = CancellationToken::new();
    let relay = Relay::new(store.clone(), publisher).with_poll_interval(Duration::from_millis(50));
    let metrics = relay.metrics();
    let running = tokio::spawn(relay.run(token.clone()));
    let start = std::time::Instant::now();
    while metrics.snapshot().dispatched < 1 && metrics.snapshot().parked < 1 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            metrics.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    token.cancel();
    let report = running.await.unwrap();
    let m = metrics.snapshot();
    assert_eq!(
        (m.dispatched, m.permanent_failures, m.parked),
        (1, 0, 0),
        "{m:?} {report}"
    );
}

/// The mock cluster fails one key's publishes for good and another's for a while, in one
/// bucket with 48 healthy keys: the healthy keys all go out while one backs off and the
/// other is parked; then the backing-off key heals and follows in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_mock_cluster_a_permanent_and_a_retriable_key_wait_alone_among_fifty() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("orders", 1, 1).expect("topic");
    // The retriable key publishes to a partition without a leader until it heals.
    cluster.create_topic("leaderless", 1, 1).expect("topic");
    cluster
        .partition_leader("leaderless", 0, None)
        .expect("no leader");
    let mut config = KafkaPublisher::config(&cluster.bootstrap_servers());
    config
        .set("message.max.bytes", "2000")
        .set("message.timeout.ms", "300");
    let publisher = KafkaPublisher::from_config(&config).expect("producer");
    let store = fresh_store(1, 6).await;
    let mut events = Vec::new();
    for round in 0..2 {
        events.push(Event::new("orders", "too-big", vec![round; 5000]));
        events.push(Event::new("leaderless", "waits", vec![round]));
        for key in 0..48 {
            events.push(Event::new("orders", format!("key-{key}"), vec![round]));
        }
    }
    commit_each(&store, events).await;
    let token = CancellationToken::new();
    let relay = Relay::new(store.clone(), publisher)
        .with_batch_budget(Duration::from_secs(2))
        .with_poll_interval(Duration::from_millis(50))
        .with_retry(
            RetryPolicy::new()
                .with_max_attempts(1_000)
                .with_initial_delay(Duration::from_millis(100))
                .with_max_delay(Duration::from_millis(400)),
        );
    let metrics = relay.metrics();
    let running = tokio::spawn(relay.run(token.clone()));
    let start = std::time::Instant::now();
    while metrics.snapshot().dispatched < 96 || metrics.snapshot().retriable_failures < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{:?}",
            metrics.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.parked, stats.behind_parked), (1, 1), "{stats:?}");
    assert_eq!(
        stats.pending, 2,
        "the retriable key's two events wait: {stats:?}"
    );
    assert_eq!(
        metrics.snapshot().dispatched,
        96,
        "only the 48 healthy keys went out"
    );

    cluster
        .partition_leader("leaderless", 0, Some(1))
        .expect("leader back");
    while store.stats().await.unwrap().pending > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "the healed key never went out"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    token.cancel();
    let report = running.await.unwrap();
    assert_eq!(report.dispatched, 98, "{report}");
    assert!(!store.parked(10).await.unwrap().is_empty());
}

/// A one-broker mock cluster with the topic `orders` of `partitions` partitions, and a
/// publisher on it with the outbox's settings plus `setting = value`.
fn mock_cluster(
    partitions: i32,
    setting: &str,
    value: &str,
) -> (
    MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    KafkaPublisher,
) {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster
        .create_topic("orders", partitions, 1)
        .expect("topic");
    let mut config = KafkaPublisher::config(&cluster.bootstrap_servers());
    config.set(setting, value);
    let publisher = KafkaPublisher::from_config(&config).expect("producer");
    (cluster, publisher)
}

/// On the real broker, an event for a topic that does not exist (tansu creates none by
/// itself) is a permanent failure: parked at its first attempt, its key's later events
/// wait, and the other keys flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_real_broker_a_topic_that_does_not_exist_parks_its_event() {
    let store = fresh_store(1, 6).await;
    let topic = create_topic(1).await;
    let missing = support::unique_name("missing");
    commit_each(
        &store,
        vec![
            Event::new(&missing, "k", b"lost?".to_vec()),
            Event::new(&topic, "k", b"behind".to_vec()),
            Event::new(&topic, "other", b"flows".to_vec()),
        ],
    )
    .await;
    let publisher = KafkaPublisher::new(&kafka_brokers()).expect("producer");
    let token = CancellationToken::new();
    let relay = Relay::new(store.clone(), publisher).with_poll_interval(Duration::from_millis(50));
    let metrics = relay.metrics();
    let running = tokio::spawn(relay.run(token.clone()));
    let start = std::time::Instant::now();
    while metrics.snapshot().parked < 1 || metrics.snapshot().dispatched < 1 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            metrics.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    token.cancel();
    running.await.unwrap();
    let parked = store.parked(10).await.unwrap();
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!(
        (parked[0].topic.as_str(), parked[0].attempts),
        (missing.as_str(), 1)
    );
    let m = metrics.snapshot();
    assert_eq!(
        (m.retriable_failures, m.permanent_failures),
        (0, 1),
        "{m:?}"
    );
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.parked, stats.behind_parked, stats.pending),
        (1, 1, 0)
    );
}
