//! The outbox relay against the seed's relay, on the same PostgreSQL and the same broker.
//!
//! Not a criterion bench: it measures a whole system (events per second drained, and the
//! time from a writer's commit to the broker's acknowledgement, p50 / p99), so it is a plain
//! program that prints a table. It needs the services:
//!
//! ```sh
//! eval "$(scripts/services start)"
//! cargo bench -p taskweave-benches --bench outbox            # three runs
//! cargo bench -p taskweave-benches --bench outbox -- --runs 1
//! ```
//!
//! The seed's relay is written here as the seed describes it: a 500 ms ticker, one batch of
//! 50 rows per tick (`ORDER BY created_at LIMIT 50 FOR UPDATE SKIP LOCKED`), one synchronous
//! publish and one `UPDATE` per row, one commit per batch. "seed, no wait" is the same
//! relay without the ticker between full batches, to separate the cost of its design from
//! the cost of its poll interval. `OUTBOX_BENCH_PRODUCER=key=value,…` adds librdkafka
//! settings to our relay's producer; `OUTBOX_BENCH_DEBUG=1` runs only the latency rows and
//! prints their quantiles, the relays' reports and acknowledgements slower than 50 ms. Every relay uses the same producer settings
//! (`KafkaPublisher::config`), the seed's with `linger.ms=0`, since it publishes one message
//! at a time and would otherwise wait the linger for each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool, Row};
use taskweave::outbox::{
    Event, EventId, KafkaPublisher, OutboxRecord, PgStore, PublishError, Publisher, Relay, Schema,
    migrate,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const KEYS: usize = 500;
const PARTITIONS: i32 = 6;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs = std::env::args()
        .skip_while(|arg| arg != "--runs")
        .nth(1)
        .map_or(3, |n| n.parse().expect("--runs N"));
    // `cargo bench` passes `--bench`; a bare `cargo test --benches` passes nothing and
    // must not need the services.
    if !std::env::args().any(|arg| arg == "--bench") {
        println!("outbox bench: run with `cargo bench -p taskweave-benches --bench outbox`");
        return;
    }
    let (Ok(url), Ok(brokers)) = (
        std::env::var("DATABASE_URL"),
        std::env::var("KAFKA_BROKERS"),
    ) else {
        eprintln!(
            "the outbox bench needs PostgreSQL and a broker: eval \"$(scripts/services start)\" first"
        );
        std::process::exit(2);
    };
    let pool = PgPoolOptions::new()
        .max_connections(24)
        .connect(&url)
        .await
        .unwrap_or_else(|error| panic!("cannot reach PostgreSQL at {url}: {error}"));

    println!("| run | relay | relays | events | events/s | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|---|---|");
    for run in 1..=runs {
        for relays in [1, 4] {
            if std::env::var_os("OUTBOX_BENCH_DEBUG").is_some() {
                break;
            }
            let (rate, _) = throughput(&pool, &brokers, Kind::Ours, relays, 20_000).await;
            println!("| {run} | taskweave, backlog | {relays} | 20000 | {rate:.0} | | |");
            let (rate, _) = throughput(&pool, &brokers, Kind::SeedNoWait, relays, 2_000).await;
            println!("| {run} | seed, no wait, backlog | {relays} | 2000 | {rate:.0} | | |");
            let (rate, _) = throughput(&pool, &brokers, Kind::Seed, relays, 500).await;
            println!("| {run} | seed, backlog | {relays} | 500 | {rate:.0} | | |");
        }
        for relays in [1, 4] {
            let (p50, p99, n) = latency(
                &pool,
                &brokers,
                Kind::Ours,
                relays,
                1_000,
                Duration::from_secs(5),
            )
            .await;
            println!("| {run} | taskweave, 1000 ev/s | {relays} | {n} | | {p50:.1} | {p99:.1} |");
            let (p50, p99, n) = latency(
                &pool,
                &brokers,
                Kind::OursNotIdempotent,
                relays,
                1_000,
                Duration::from_secs(5),
            )
            .await;
            println!(
                "| {run} | taskweave, 1000 ev/s, idempotence off | {relays} | {n} | | {p50:.1} | {p99:.1} |"
            );
            let (p50, p99, n) = latency(
                &pool,
                &brokers,
                Kind::Seed,
                relays,
                50,
                Duration::from_secs(5),
            )
            .await;
            println!("| {run} | seed, 50 ev/s | {relays} | {n} | | {p50:.1} | {p99:.1} |");
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ours,
    /// Ours with `enable.idempotence=false`: tansu 0.6 answers some idempotent produce
    /// requests only after about a second (measured: about 0.3 % of them), which the
    /// latency rows show; this row separates that broker's stall from the relay.
    OursNotIdempotent,
    Seed,
    SeedNoWait,
}

/// A fresh outbox and topic.
async fn setup(pool: &PgPool, brokers: &str) -> (PgStore, String) {
    let name = format!(
        "bench_{}_{}",
        std::process::id(),
        EventId::new().as_uuid().simple()
    );
    let schema = Schema::new(&name);
    migrate(pool, &schema, 64).await.expect("migrate");
    let store = PgStore::connect(pool.clone(), schema)
        .await
        .expect("connect");
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin");
    admin
        .create_topics(
            &[NewTopic::new(&name, PARTITIONS, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .expect("create topic")
        .into_iter()
        .for_each(|result| {
            result.expect("topic created");
        });
    (store, name)
}

async fn teardown(pool: &PgPool, store: &PgStore) {
    sqlx::query(AssertSqlSafe(format!(
        "DROP SCHEMA \"{}\" CASCADE",
        store.schema().schema()
    )))
    .execute(pool)
    .await
    .expect("drop schema");
}

/// Relays `events` enqueued beforehand; events per second from the relays' start to the
/// last commit.
async fn throughput(
    pool: &PgPool,
    brokers: &str,
    kind: Kind,
    relays: usize,
    events: usize,
) -> (f64, Duration) {
    let (store, topic) = setup(pool, brokers).await;
    for chunk in (0..events).collect::<Vec<_>>().chunks(500) {
        let batch = chunk
            .iter()
            .map(|i| Event::new(&topic, format!("key-{}", i % KEYS), vec![b'x'; 200]))
            .collect();
        let mut tx = pool.begin().await.unwrap();
        store.enqueue_batch(&mut tx, batch).await.unwrap();
        tx.commit().await.unwrap();
    }
    let acks = Acks::default();
    let token = CancellationToken::new();
    let start = Instant::now();
    let tasks = spawn_relays(&store, brokers, kind, relays, &acks, &token);
    while store.pending().await.unwrap() > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = start.elapsed();
    token.cancel();
    for task in tasks {
        task.await.unwrap();
    }
    teardown(pool, &store).await;
    (events as f64 / took.as_secs_f64(), took)
}

/// Writers commit `rate` events per second for `length` while the relays run; returns the
/// p50 and p99 of commit → acknowledgement in milliseconds, and the count.
async fn latency(
    pool: &PgPool,
    brokers: &str,
    kind: Kind,
    relays: usize,
    rate: u32,
    length: Duration,
) -> (f64, f64, usize) {
    let (store, topic) = setup(pool, brokers).await;
    let acks = Acks::default();
    let token = CancellationToken::new();
    let tasks = spawn_relays(&store, brokers, kind, relays, &acks, &token);
    let committed: Arc<Mutex<HashMap<EventId, Instant>>> = Arc::default();
    let writers = 4;
    let mut writer_tasks = Vec::new();
    for w in 0..writers {
        let (store, topic, committed) = (store.clone(), topic.clone(), committed.clone());
        writer_tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1) * writers / rate);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let end = Instant::now() + length;
            let mut i = 0_usize;
            while Instant::now() < end {
                tick.tick().await;
                let key = format!("key-{}", (i * writers as usize + w as usize) % KEYS);
                let mut tx = store.pool().begin().await.unwrap();
                let id = store
                    .enqueue(&mut tx, Event::new(&topic, key, vec![b'x'; 200]))
                    .await
                    .unwrap();
                store.commit(tx).await.unwrap();
                committed.lock().unwrap().insert(id, Instant::now());
                i += 1;
            }
        }));
    }
    for writer in writer_tasks {
        writer.await.unwrap();
    }
    while store.pending().await.unwrap() > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    token.cancel();
    for task in tasks {
        task.await.unwrap();
    }
    teardown(pool, &store).await;
    let committed = committed.lock().unwrap();
    let acked = acks.0.lock().unwrap();
    let mut latencies: Vec<f64> = committed
        .iter()
        .filter_map(|(id, at)| {
            acked
                .get(id)
                .map(|ack| ack.saturating_duration_since(*at).as_secs_f64() * 1000.0)
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    if std::env::var_os("OUTBOX_BENCH_DEBUG").is_some() {
        for q in [0.5, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 1.0] {
            let i = ((latencies.len() as f64 * q) as usize).min(latencies.len() - 1);
            eprintln!("q{q}: {:.1} ms", latencies[i]);
        }
    }
    let pick = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    (pick(0.50), pick(0.99), latencies.len())
}

/// When each event's acknowledgement came back (the first time).
#[derive(Clone, Default)]
struct Acks(Arc<Mutex<HashMap<EventId, Instant>>>);

impl Acks {
    fn record(&self, id: EventId) {
        self.0
            .lock()
            .unwrap()
            .entry(id)
            .or_insert_with(Instant::now);
    }
}

fn spawn_relays(
    store: &PgStore,
    brokers: &str,
    kind: Kind,
    relays: usize,
    acks: &Acks,
    token: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..relays)
        .map(|n| {
            let token = token.clone();
            let acks = acks.clone();
            match kind {
                Kind::Ours | Kind::OursNotIdempotent => {
                    let mut config = KafkaPublisher::config(brokers);
                    if kind == Kind::OursNotIdempotent {
                        config.set("enable.idempotence", "false");
                    }
                    if let Ok(extra) = std::env::var("OUTBOX_BENCH_PRODUCER") {
                        for pair in extra.split(',') {
                            let (k, v) = pair.split_once('=').expect("key=value");
                            config.set(k, v);
                        }
                    }
                    let publisher = Timed {
                        inner: KafkaPublisher::from_config(&config).expect("producer"),
                        acks,
                    };
                    let relay =
                        Relay::new(store.clone(), publisher).with_name(format!("relay-{n}"));
                    let metrics = relay.metrics();
                    tokio::spawn(async move {
                        let report = relay.run(token).await;
                        if std::env::var_os("OUTBOX_BENCH_DEBUG").is_some() {
                            eprintln!("{report}\n{:?}", metrics.snapshot());
                        }
                    })
                }
                Kind::Seed | Kind::SeedNoWait => {
                    let mut config = KafkaPublisher::config(brokers);
                    config.set("linger.ms", "0");
                    let producer: FutureProducer = config.create().expect("producer");
                    tokio::spawn(seed_relay(
                        store.clone(),
                        producer,
                        acks,
                        token,
                        kind == Kind::Seed,
                    ))
                }
            }
        })
        .collect()
}

/// A publisher that records when each acknowledgement arrives.
struct Timed {
    inner: KafkaPublisher,
    acks: Acks,
}

impl Publisher for Timed {
    type Delivery = futures::future::BoxFuture<'static, Result<(), PublishError>>;

    async fn send(&self, record: &OutboxRecord) -> Result<Self::Delivery, PublishError> {
        let delivery = self.inner.send(record).await?;
        let (acks, id) = (self.acks.clone(), record.event_id);
        let sent = Instant::now();
        Ok(Box::pin(async move {
            delivery.await?;
            if std::env::var_os("OUTBOX_BENCH_DEBUG").is_some()
                && sent.elapsed() > Duration::from_millis(50)
            {
                eprintln!("slow ack: {:?}", sent.elapsed());
            }
            acks.record(id);
            Ok(())
        }))
    }
}

/// The seed's relay: a ticker, 50 rows per tick by `created_at` with row-level SKIP
/// LOCKED, a synchronous publish and an UPDATE per row.
async fn seed_relay(
    store: PgStore,
    producer: FutureProducer,
    acks: Acks,
    token: CancellationToken,
    ticker: bool,
) {
    let events = store.schema().events_table();
    let claim = format!(
        "SELECT id, event_id, topic, key, payload FROM {events}
         WHERE dispatched_at IS NULL ORDER BY created_at LIMIT 50 FOR UPDATE SKIP LOCKED"
    );
    let mark = format!("UPDATE {events} SET dispatched_at = now() WHERE id = $1");
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        if ticker {
            tokio::select! {
                biased;
                () = token.cancelled() => return,
                _ = tick.tick() => {}
            }
        } else if token.is_cancelled() {
            return;
        }
        let mut tx = store.pool().begin().await.unwrap();
        let rows = sqlx::query(AssertSqlSafe(claim.clone()))
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        let full = rows.len() == 50;
        for row in &rows {
            let id: i64 = row.get("id");
            let event_id: uuid::Uuid = row.get("event_id");
            let topic: String = row.get("topic");
            let key: Vec<u8> = row.get("key");
            let payload: Vec<u8> = row.get("payload");
            let record = FutureRecord::to(&topic).key(&key).payload(&payload);
            producer
                .send(record, Duration::from_secs(5))
                .await
                .map_err(|(error, _)| error)
                .expect("the seed's publish");
            acks.record(EventId::from_uuid(event_id));
            sqlx::query(AssertSqlSafe(mark.clone()))
                .bind(id)
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
        if !ticker && !full {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
