//! Operations: the real broker process stopped and started again, and the PostgreSQL server
//! restarted, while relays run. Each test runs private instances (their own directory and
//! ports, started with `scripts/services`), so stopping them disturbs no other test.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use taskweave_outbox::{
    Event, EventId, KafkaPublisher, MemoryPublisher, PgStore, Relay, RetryPolicy, Schema, Store,
    migrate,
};
use tokio_util::sync::CancellationToken;

use crate::support::{self, create_topic_on, read_topic_on, unique_name};

/// Private service instances; stopped and removed on drop, even when the test fails.
struct Private {
    dir: PathBuf,
    pg_port: u16,
    kafka_port: u16,
}

impl Private {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(unique_name("taskweave-ops"));
        Self {
            dir,
            pg_port: free_port(),
            kafka_port: free_port(),
        }
    }

    /// Runs `scripts/services <what>` on these instances; returns what it printed.
    fn run(&self, what: &str) -> String {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services");
        let output = Command::new("bash")
            .arg(script)
            .arg(what)
            .env("TASKWEAVE_SERVICES_DIR", &self.dir)
            .env("TASKWEAVE_PG_PORT", self.pg_port.to_string())
            .env("TASKWEAVE_KAFKA_PORT", self.kafka_port.to_string())
            .output()
            .unwrap_or_else(|error| panic!("could not run scripts/services {what}: {error}"));
        assert!(
            output.status.success(),
            "scripts/services {what} failed (run `scripts/services install` once):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.kafka_port)
    }

    fn database_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.pg_port)
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        self.run("stop");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// Polls `done` every 50 ms for up to `limit`; on a timeout, says what the store holds.
async fn wait_until(
    what: &str,
    limit: Duration,
    store: &PgStore,
    mut done: impl AsyncFnMut() -> bool,
) {
    let start = std::time::Instant::now();
    while !done().await {
        if start.elapsed() >= limit {
            let stats = store.stats().await;
            let parked = store.parked(5).await;
            panic!("timed out waiting for {what}: {stats:?}, parked: {parked:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The broker process is stopped for a minute and started again: the relay never stops,
/// events written meanwhile back off and wait, the lag rises while it is down and falls
/// once it is back, and every event reaches the broker once, in per-key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_stopped_for_a_minute_and_started_again_loses_nothing() {
    let services = Private::new();
    services.run("start-kafka");
    let brokers = services.brokers();
    create_topic_on(&brokers, "orders", 3).await;
    let store = support::fresh_store(16, 6).await;
    let publisher = KafkaPublisher::new(&brokers).expect("producer");
    let token = CancellationToken::new();
    let relay = Relay::new(store.clone(), publisher)
        .with_poll_interval(Duration::from_millis(200))
        .with_retry(
            RetryPolicy::new()
                .with_max_attempts(1_000)
                .with_initial_delay(Duration::from_millis(500))
                .with_max_delay(Duration::from_secs(4)),
        );
    let metrics = relay.metrics();
    let running = tokio::spawn(relay.run(token.clone()));

    let events = |round: usize| -> Vec<Event> {
        (0..100)
            .map(|i| {
                Event::new(
                    "orders",
                    format!("key-{}", i % 20),
                    format!("{round}-{i}").into_bytes(),
                )
            })
            .collect()
    };
    let before = events(0);
    support::commit_each(&store, before.clone()).await;
    // A producer whose first requests met a broker still starting under load can go silent
    // too; the relay then replaces it, which takes a few stalled batches.
    wait_until(
        "the first events",
        Duration::from_secs(120),
        &store,
        async || store.pending().await.unwrap() == 0,
    )
    .await;
    let first = {
        let brokers = brokers.clone();
        tokio::task::spawn_blocking(move || {
            read_topic_on(&brokers, "orders", 3, 100, Duration::from_millis(500))
        })
        .await
        .unwrap()
    };
    assert_eq!(first.len(), 100);

    services.run("stop-kafka");
    let during = events(1);
    support::commit_each(&store, during.clone()).await;
    let down_since = std::time::Instant::now();
    let mut highest_lag = Duration::ZERO;
    while down_since.elapsed() < Duration::from_secs(60) {
        let stats = store.stats().await.unwrap();
        highest_lag = highest_lag.max(stats.oldest_pending_age.unwrap_or_default());
        assert_eq!(
            stats.parked, 0,
            "nothing is parked for a broker that is down"
        );
        assert!(!running.is_finished(), "the relay keeps running");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        store.pending().await.unwrap(),
        100,
        "nothing marked while it is down"
    );
    assert!(
        highest_lag >= Duration::from_secs(55),
        "the lag rose: {highest_lag:?}"
    );
    assert!(
        metrics.snapshot().retriable_failures >= 20,
        "{:?}",
        metrics.snapshot()
    );

    // Started again (memory storage: the topic is made again, empty).
    services.run("start-kafka");
    create_topic_on(&brokers, "orders", 3).await;
    // An attempt that reached the broker between its start and the topic's creation met an
    // unknown topic, which parks (permanent). That gap exists only because tansu's memory
    // storage forgets its topics; an operator would retry those keys once the topic is
    // back, and so does this test. Any other parked event fails it.
    wait_until(
        "the events written while it was down",
        Duration::from_secs(120),
        &store,
        async || {
            for parked in store.parked(100).await.unwrap() {
                let error = parked.last_error.clone().unwrap_or_default();
                assert!(
                    error.to_lowercase().contains("unknown topic"),
                    "parked for another reason: {parked:?}"
                );
                store.retry_parked_key(&parked.key).await.unwrap();
            }
            store.pending().await.unwrap() == 0
        },
    )
    .await;
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.oldest_pending_age, None, "the lag fell");
    let after = {
        let brokers = brokers.clone();
        tokio::task::spawn_blocking(move || {
            read_topic_on(&brokers, "orders", 3, 100, Duration::from_secs(1))
        })
        .await
        .unwrap()
    };
    assert!(!running.is_finished(), "the relay kept running");
    // tansu's memory storage forgot the idempotent producer: only a new one gets through.
    assert!(
        metrics.snapshot().publisher_recoveries >= 1,
        "{:?}",
        metrics.snapshot()
    );
    token.cancel();
    let report = running.await.unwrap();
    assert_eq!(report.dispatched, 200, "{report}");
    let committed: Vec<(Vec<u8>, Vec<u8>)> = during
        .iter()
        .map(|e| (e.key().to_vec(), e.payload().to_vec()))
        .collect();
    let delivered: Vec<(Vec<u8>, Vec<u8>)> = after
        .iter()
        .map(|c| (c.key.clone(), c.payload.clone()))
        .collect();
    assert_eq!(
        support::assert_per_key_order(&committed, &delivered),
        0,
        "once each"
    );
}

/// PostgreSQL restarts (the cluster stopped and started again) while two relays run and a
/// writer writes: the relays reconnect, and every event whose commit succeeded is
/// published, in per-key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarts_while_relays_run_and_nothing_is_lost() {
    let services = Private::new();
    services.run("start-pg");
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&services.database_url())
        .await
        .expect("the private cluster");
    let schema = Schema::new("ops");
    migrate(&pool, &schema, 16).await.unwrap();
    let store = PgStore::connect(pool.clone(), schema).await.unwrap();
    let publisher = MemoryPublisher::new();
    let token = CancellationToken::new();
    let relays: Vec<_> = (0..2)
        .map(|n| {
            let relay = Relay::new(store.clone(), publisher.clone())
                .with_name(format!("relay-{n}"))
                .with_batch_budget(Duration::from_secs(2))
                .with_buckets_per_batch(4)
                .with_poll_interval(Duration::from_millis(100));
            tokio::spawn(relay.run(token.clone()))
        })
        .collect();

    // The writer: events whose commit returned Ok must be published; a commit that failed
    // may or may not have happened.
    let committed: Arc<Mutex<Vec<(EventId, Event)>>> = Arc::default();
    let writer = {
        let store = store.clone();
        let committed = Arc::clone(&committed);
        tokio::spawn(async move {
            let mut failures = 0;
            let mut i = 0;
            while committed.lock().unwrap().len() < 300 {
                let event = Event::new(
                    "orders",
                    format!("key-{}", i % 10),
                    format!("{i}").into_bytes(),
                );
                i += 1;
                let written = async {
                    let mut tx = store.pool().begin().await?;
                    let id = store
                        .enqueue(&mut tx, event.clone())
                        .await
                        .map_err(|e| match e {
                            taskweave_outbox::EnqueueError::Store(
                                taskweave_outbox::StoreError::Database(e),
                            ) => e,
                            other => panic!("{other}"),
                        })?;
                    store.commit(tx).await?;
                    Ok::<_, sqlx::Error>(id)
                };
                match written.await {
                    Ok(id) => committed.lock().unwrap().push((id, event)),
                    Err(_) => {
                        failures += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            failures
        })
    };
    wait_until(
        "a third of the writes",
        Duration::from_secs(60),
        &store,
        async || committed.lock().unwrap().len() >= 100,
    )
    .await;
    services.run("stop-pg");
    tokio::time::sleep(Duration::from_secs(3)).await;
    services.run("start-pg");
    let failures = writer.await.unwrap();
    assert!(failures > 0, "the writer saw the restart");
    wait_until(
        "every committed event",
        Duration::from_secs(60),
        &store,
        async || {
            let published: HashSet<EventId> =
                publisher.published().iter().map(|p| p.event_id).collect();
            committed
                .lock()
                .unwrap()
                .iter()
                .all(|(id, _)| published.contains(id))
                && store.pending().await.is_ok_and(|n| n == 0)
        },
    )
    .await;
    token.cancel();
    let mut store_errors = 0;
    for relay in relays {
        let report = relay.await.unwrap();
        store_errors += report.store_errors;
    }
    assert!(store_errors > 0, "the relays saw the restart and went on");
    // Per-key order of first delivery, over the events known committed.
    let known: HashSet<EventId> = committed
        .lock()
        .unwrap()
        .iter()
        .map(|(id, _)| *id)
        .collect();
    let order: Vec<(Vec<u8>, Vec<u8>)> = committed
        .lock()
        .unwrap()
        .iter()
        .map(|(_, e)| (e.key().to_vec(), e.payload().to_vec()))
        .collect();
    let mut seen = HashSet::new();
    let delivered: Vec<(Vec<u8>, Vec<u8>)> = publisher
        .published()
        .into_iter()
        .filter(|p| known.contains(&p.event_id) && seen.insert(p.event_id))
        .map(|p| (p.key, p.payload))
        .collect();
    assert_eq!(support::assert_per_key_order(&order, &delivered), 0);
}
