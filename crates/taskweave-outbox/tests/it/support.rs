//! The real services the tests run against, and small helpers.
//!
//! PostgreSQL: `DATABASE_URL`, or, when it is unset, the throwaway cluster that
//! `scripts/services` starts (the same one `scripts/test` uses). Kafka: `KAFKA_BROKERS`,
//! or the tansu broker `scripts/services` starts. A test that cannot reach a service fails
//! with a message naming the fix; none is skipped.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use taskweave_outbox::{EVENT_ID_HEADER, Event, PgStore, SEQUENCE_HEADER, Schema, migrate};

fn services_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services")
}

/// Runs `scripts/services <what>` once per test binary and reads the `export` lines it prints.
fn started_services(what: &'static str) -> HashMap<String, String> {
    let output = Command::new("bash")
        .arg(services_script())
        .arg(what)
        .output()
        .unwrap_or_else(|error| panic!("could not run scripts/services {what}: {error}"));
    assert!(
        output.status.success(),
        "scripts/services {what} failed (run `scripts/services install` once, or set DATABASE_URL and KAFKA_BROKERS to running services):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.strip_prefix("export "))
        .filter_map(|pair| pair.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// The PostgreSQL server's URL.
pub(crate) fn database_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| match std::env::var("DATABASE_URL") {
        Ok(url) => url,
        Err(_) => started_services("start-pg")
            .remove("DATABASE_URL")
            .expect("scripts/services prints DATABASE_URL"),
    })
    .clone()
}

/// The Kafka-protocol broker's address.
pub(crate) fn kafka_brokers() -> String {
    static BROKERS: OnceLock<String> = OnceLock::new();
    BROKERS
        .get_or_init(|| match std::env::var("KAFKA_BROKERS") {
            Ok(brokers) => brokers,
            Err(_) => started_services("start")
                .remove("KAFKA_BROKERS")
                .expect("scripts/services prints KAFKA_BROKERS"),
        })
        .clone()
}

/// A pool on the test server.
pub(crate) async fn pool(max_connections: u32) -> PgPool {
    pool_named(max_connections, "taskweave-outbox-tests").await
}

/// A pool whose sessions carry `application_name`, so a test can find them in
/// `pg_stat_activity`.
pub(crate) async fn pool_named(max_connections: u32, application_name: &str) -> PgPool {
    pool_with(max_connections, application_name, PgPoolOptions::new()).await
}

/// [`pool_named`] with `options` (the connection limit and acquire timeout are set here).
pub(crate) async fn pool_with(
    max_connections: u32,
    application_name: &str,
    options: PgPoolOptions,
) -> PgPool {
    let pool_options = options;
    let url = database_url();
    let options = url
        .parse::<PgConnectOptions>()
        .unwrap_or_else(|error| panic!("DATABASE_URL {url:?}: {error}"))
        .application_name(application_name);
    pool_options
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .unwrap_or_else(|error| {
            panic!(
                "cannot reach PostgreSQL at {url}: {error}\nstart it with `eval \"$(scripts/services start)\"`, or unset DATABASE_URL to let the tests start the throwaway cluster"
            )
        })
}

/// How many sessions of the pool named `application_name` sit inside a transaction, as
/// `observer` (another pool) sees them.
pub(crate) async fn sessions_in_transaction(observer: &PgPool, application_name: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state LIKE 'idle in transaction%'",
    )
    .bind(application_name)
    .fetch_one(observer)
    .await
    .unwrap()
}

/// A schema name no other test (or test run) uses.
pub(crate) fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .subsec_nanos();
    format!("{prefix}_{}_{n}_{nanos}", std::process::id())
}

/// A pool and a freshly migrated outbox in a schema of its own.
pub(crate) async fn fresh_store(buckets: u32, max_connections: u32) -> PgStore {
    let pool = pool(max_connections).await;
    let schema = Schema::new(&unique_name("t"));
    migrate(&pool, &schema, buckets).await.expect("migrate");
    PgStore::connect(pool, schema).await.expect("connect")
}

/// Enqueues and commits each event in a transaction of its own, in order.
pub(crate) async fn commit_each(store: &PgStore, events: Vec<Event>) {
    for event in events {
        let mut tx = store.pool().begin().await.expect("begin");
        store.enqueue(&mut tx, event).await.expect("enqueue");
        store.commit(tx).await.expect("commit");
    }
}

/// A topic with `partitions` partitions on the test broker.
pub(crate) async fn create_topic(partitions: i32) -> String {
    let name = unique_name("topic");
    create_topic_on(&kafka_brokers(), &name, partitions).await;
    name
}

/// Creates topic `name` on `brokers`.
pub(crate) async fn create_topic_on(brokers: &str, name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let results = admin
        .create_topics(
            &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap_or_else(|error| {
            panic!(
                "cannot reach the Kafka broker at {brokers}: {error}\nstart it with `eval \"$(scripts/services start)\"`, or unset KAFKA_BROKERS to let the tests start it"
            )
        });
    for result in results {
        result.unwrap_or_else(|(topic, error)| panic!("creating topic {topic}: {error}"));
    }
}

/// One message read back from the broker.
#[derive(Clone, Debug)]
pub(crate) struct Consumed {
    pub(crate) partition: i32,
    pub(crate) key: Vec<u8>,
    pub(crate) payload: Vec<u8>,
    pub(crate) event_id: String,
    pub(crate) sequence: i64,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
}

/// Reads `topic` from the beginning of every partition until at least `at_least` messages
/// came (failing after 60 s without reaching it), then for `linger` more to catch any
/// extra (duplicates); returns them in partition order (each partition in offset order).
pub(crate) fn read_topic(
    topic: &str,
    partitions: i32,
    at_least: usize,
    linger: Duration,
) -> Vec<Consumed> {
    read_topic_on(&kafka_brokers(), topic, partitions, at_least, linger)
}

/// [`read_topic`] on `brokers`.
pub(crate) fn read_topic_on(
    brokers: &str,
    topic: &str,
    partitions: i32,
    at_least: usize,
    linger: Duration,
) -> Vec<Consumed> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique_name("reader"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for partition in 0..partitions {
        assignment
            .add_partition_offset(topic, partition, Offset::Beginning)
            .expect("partition");
    }
    consumer.assign(&assignment).expect("assign");
    let mut out = Vec::new();
    let start = std::time::Instant::now();
    let mut reached: Option<std::time::Instant> = None;
    while reached.is_none_or(|at| at.elapsed() < linger) {
        assert!(
            reached.is_some() || start.elapsed() < Duration::from_secs(60),
            "{topic}: only {} of at least {at_least} messages after 60 s",
            out.len()
        );
        if reached.is_none() && out.len() >= at_least {
            reached = Some(std::time::Instant::now());
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                let mut headers = Vec::new();
                if let Some(all) = message.headers() {
                    for header in all.iter() {
                        headers.push((
                            header.key.to_owned(),
                            header.value.unwrap_or_default().to_vec(),
                        ));
                    }
                }
                let find = |name: &str| {
                    headers
                        .iter()
                        .find(|(key, _)| key == name)
                        .map(|(_, value)| String::from_utf8(value.clone()).expect("utf-8 header"))
                        .unwrap_or_else(|| panic!("header {name} missing"))
                };
                out.push(Consumed {
                    partition: message.partition(),
                    key: message.key().unwrap_or_default().to_vec(),
                    payload: message.payload().unwrap_or_default().to_vec(),
                    event_id: find(EVENT_ID_HEADER),
                    sequence: find(SEQUENCE_HEADER).parse().expect("a number"),
                    headers,
                });
            }
            Some(Err(error)) => panic!("consuming {topic}: {error}"),
            None => {}
        }
    }
    out
}

/// Asserts that, for every key, the first deliveries in `delivered` (key, payload) come in
/// the order of `committed` for that key, with nothing missing and nothing unknown; returns
/// how many deliveries were duplicates.
pub(crate) fn assert_per_key_order(
    committed: &[(Vec<u8>, Vec<u8>)],
    delivered: &[(Vec<u8>, Vec<u8>)],
) -> usize {
    let mut expected: HashMap<&[u8], Vec<&[u8]>> = HashMap::new();
    for (key, payload) in committed {
        expected.entry(key).or_default().push(payload);
    }
    let mut first: HashMap<&[u8], Vec<&[u8]>> = HashMap::new();
    let mut seen = std::collections::HashSet::new();
    let mut duplicates = 0;
    for (key, payload) in delivered {
        if seen.insert((key.as_slice(), payload.as_slice())) {
            first.entry(key).or_default().push(payload);
        } else {
            duplicates += 1;
        }
    }
    assert_eq!(first.len(), expected.len(), "keys delivered vs committed");
    for (key, payloads) in &expected {
        let got = first
            .get(key)
            .unwrap_or_else(|| panic!("key {:?} never delivered", String::from_utf8_lossy(key)));
        assert_eq!(
            got,
            payloads,
            "order of first delivery for key {:?}",
            String::from_utf8_lossy(key)
        );
    }
    duplicates
}
