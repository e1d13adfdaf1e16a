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
//! cargo bench -p taskweave-benches --bench outbox -- --runs 3 --only production
//! cargo bench -p taskweave-benches --bench outbox -- --claim-10m   # about 5 minutes
//! cargo bench -p taskweave-benches --bench outbox -- --claim-parked # its last table only
//! cargo bench -p taskweave-benches --bench outbox -- --soak        # 1,000,000 events
//! ```
//!
//! `--only production` runs the rows of the production issue only: writers in another
//! process with `LISTEN`/`NOTIFY` on and off (latency, and what `NOTIFY` costs committers),
//! and 1 % / 10 % of keys failing (the healthy keys' throughput and latency).
//! `--claim-10m` times the claim with 10,000,000 dispatched rows kept, against an empty
//! table, and the retention's delete rate. `--soak` sends 1,000,000 events through 4 relays
//! with 5 % of publishes failing (retriable), retention on, and reports what was lost,
//! order violations, dead tuples and the process's memory.
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

#[path = "services.rs"]
mod services;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::{AssertSqlSafe, PgPool, Row};
use taskweave::outbox::{
    Batch, ClaimLimits, Event, EventId, KafkaPublisher, OutboxRecord, PgStore, PublishError,
    Publisher, Relay, Retention, RetryPolicy, Schema, Store, migrate,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const KEYS: usize = 500;
const PARTITIONS: i32 = 6;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(services::Services {
        runs,
        pool,
        brokers,
    }) = services::connect("outbox", 24).await
    else {
        return;
    };
    if std::env::args().any(|arg| arg == "--soak") {
        soak(&pool).await;
        return;
    }
    if std::env::args().any(|arg| arg == "--claim-parked") {
        claim_behind_a_parked_key(&pool).await;
        return;
    }
    if std::env::args().any(|arg| arg == "--claim-10m") {
        claim_with_dispatched_rows(&pool).await;
        return;
    }
    let only_production = std::env::args()
        .skip_while(|arg| arg != "--only")
        .nth(1)
        .is_some_and(|only| only == "production");
    if only_production {
        production(&pool, &brokers, runs).await;
        return;
    }

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
    production(&pool, &brokers, runs).await;
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
    throughput_with(pool, brokers, kind, relays, events, &Faults::none()).await
}

/// [`throughput`] with the keys of `faults` failing: events per second of the healthy
/// keys, until only the failing keys' events are left.
async fn throughput_with(
    pool: &PgPool,
    brokers: &str,
    kind: Kind,
    relays: usize,
    events: usize,
    faults: &Faults,
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
    let tasks = spawn_relays(&store, brokers, kind, relays, &acks, &token, faults);
    let failing = (0..events)
        .filter(|i| faults.0.contains(format!("key-{}", i % KEYS).as_bytes()))
        .count();
    while store.pending().await.unwrap() > failing as i64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = start.elapsed();
    token.cancel();
    for task in tasks {
        task.await.unwrap();
    }
    teardown(pool, &store).await;
    ((events - failing) as f64 / took.as_secs_f64(), took)
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
    latency_with(
        pool,
        brokers,
        kind,
        relays,
        rate,
        length,
        &Faults::none(),
        None,
    )
    .await
}

/// [`latency`] with the keys of `faults` failing (the quantiles are the healthy keys'),
/// and, with `elsewhere = Some(notify)`, writers that share no process with the relays:
/// they use a store of their own and commit without the in-process nudge, so only the
/// poll or, with `notify`, `LISTEN`/`NOTIFY` wakes the relays.
#[allow(clippy::too_many_arguments, reason = "a bench's knobs")]
async fn latency_with(
    pool: &PgPool,
    brokers: &str,
    kind: Kind,
    relays: usize,
    rate: u32,
    length: Duration,
    faults: &Faults,
    elsewhere: Option<bool>,
) -> (f64, f64, usize) {
    let (mut store, topic) = setup(pool, brokers).await;
    let writer_store = match elsewhere {
        Some(notify) => {
            store = PgStore::connect(pool.clone(), store.schema().clone())
                .await
                .unwrap()
                .with_notify(notify);
            PgStore::connect(pool.clone(), store.schema().clone())
                .await
                .unwrap()
                .with_notify(notify)
        }
        None => store.clone(),
    };
    let acks = Acks::default();
    let token = CancellationToken::new();
    let tasks = spawn_relays(&store, brokers, kind, relays, &acks, &token, faults);
    let committed: Arc<Mutex<HashMap<EventId, Instant>>> = Arc::default();
    let writers = 4;
    let mut writer_tasks = Vec::new();
    for w in 0..writers {
        let (store, topic, committed) = (writer_store.clone(), topic.clone(), committed.clone());
        let (faults, nudge) = (faults.clone(), elsewhere.is_none());
        writer_tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1) * writers / rate);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let end = Instant::now() + length;
            let mut i = 0_usize;
            while Instant::now() < end {
                tick.tick().await;
                let key = format!("key-{}", (i * writers as usize + w as usize) % KEYS);
                i += 1;
                let failing = faults.0.contains(key.as_bytes());
                let mut tx = store.pool().begin().await.unwrap();
                let id = store
                    .enqueue(&mut tx, Event::new(&topic, key, vec![b'x'; 200]))
                    .await
                    .unwrap();
                if nudge {
                    store.commit(tx).await.unwrap();
                } else {
                    tx.commit().await.unwrap();
                }
                if !failing {
                    committed.lock().unwrap().insert(id, Instant::now());
                }
            }
        }));
    }
    for writer in writer_tasks {
        writer.await.unwrap();
    }
    let expected = committed.lock().unwrap().len();
    while acks.0.lock().unwrap().len() < expected {
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
    faults: &Faults,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..relays)
        .map(|n| {
            let token = token.clone();
            let acks = acks.clone();
            let faults = faults.clone();
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
                        faults,
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

/// A publisher that records when each acknowledgement arrives, and refuses the keys
/// `faults` names.
struct Timed {
    inner: KafkaPublisher,
    acks: Acks,
    faults: Faults,
}

/// Keys whose every publish fails (retriable): a broken partition, say.
#[derive(Clone, Default)]
struct Faults(Arc<HashSet<Vec<u8>>>);

impl Faults {
    fn none() -> Self {
        Self::default()
    }

    /// `percent` of the bench's keys.
    fn keys(percent: usize) -> Self {
        let failing = KEYS * percent / 100;
        Self(Arc::new(
            (0..failing)
                .map(|k| format!("key-{}", k * (100 / percent.max(1))).into_bytes())
                .collect(),
        ))
    }
}

impl Publisher for Timed {
    type Delivery = futures::future::BoxFuture<'static, Result<(), PublishError>>;

    async fn send(&self, record: &OutboxRecord) -> Result<Self::Delivery, PublishError> {
        if self.faults.0.contains(&record.key) {
            return Err(PublishError::retriable("injected: partition unavailable"));
        }
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

/// The production rows: cross-process wake-ups with `NOTIFY` on and off, what `NOTIFY`
/// costs committers, and failing keys.
async fn production(pool: &PgPool, brokers: &str, runs: usize) {
    println!();
    println!("| run | row | relays | events | events/s | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|---|---|");
    for run in 1..=runs {
        for rate in [1_000, 50] {
            for notify in [false, true] {
                let (p50, p99, n) = latency_with(
                    pool,
                    brokers,
                    Kind::Ours,
                    2,
                    rate,
                    Duration::from_secs(5),
                    &Faults::none(),
                    Some(notify),
                )
                .await;
                let on = if notify { "on" } else { "off" };
                println!(
                    "| {run} | writers in another process, NOTIFY {on}, {rate} ev/s | 2 | {n} | | {p50:.1} | {p99:.1} |"
                );
            }
        }
        for notify in [false, true] {
            let rate = notify_commit_cost(pool, notify).await;
            let on = if notify { "on" } else { "off" };
            println!(
                "| {run} | 8 writers committing one event each, NOTIFY {on} | 0 | | {rate:.0} commits/s | | |"
            );
        }
        for percent in [0, 1, 10] {
            let faults = Faults::keys(percent);
            let (rate, _) = throughput_with(pool, brokers, Kind::Ours, 2, 20_000, &faults).await;
            println!(
                "| {run} | backlog, {percent} % of keys failing (healthy keys) | 2 | 20000 | {rate:.0} | | |"
            );
            let (p50, p99, n) = latency_with(
                pool,
                brokers,
                Kind::Ours,
                2,
                1_000,
                Duration::from_secs(5),
                &faults,
                None,
            )
            .await;
            println!(
                "| {run} | 1000 ev/s, {percent} % of keys failing (healthy keys) | 2 | {n} | | {p50:.1} | {p99:.1} |"
            );
        }
    }
}

/// Commits per second of 8 writers, each committing one-event transactions for 3 s.
async fn notify_commit_cost(pool: &PgPool, notify: bool) -> f64 {
    let name = format!("bench_notify_{}", EventId::new().as_uuid().simple());
    let schema = Schema::new(&name);
    migrate(pool, &schema, 64).await.expect("migrate");
    let store = PgStore::connect(pool.clone(), schema)
        .await
        .expect("connect")
        .with_notify(notify);
    let commits = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs(3);
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (store, commits) = (store.clone(), commits.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while Instant::now() < end {
                    let mut tx = store.pool().begin().await.unwrap();
                    store
                        .enqueue(
                            &mut tx,
                            Event::new("t", format!("w{w}-{i}"), vec![b'x'; 200]),
                        )
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                    commits.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    teardown(pool, &store).await;
    commits.load(Ordering::Relaxed) as f64 / 3.0
}

/// The claim's time with 10,000,000 dispatched rows kept, against a table with none, and
/// the retention's delete rate on them.
async fn claim_with_dispatched_rows(pool: &PgPool) {
    println!("| dispatched rows kept | claims | claim p50 ms | claim p99 ms |");
    println!("|---|---|---|---|");
    for dispatched in [0_i64, 10_000_000] {
        let name = format!("bench_claim_{}", EventId::new().as_uuid().simple());
        let schema = Schema::new(&name);
        migrate(pool, &schema, 64).await.expect("migrate");
        let store = PgStore::connect(pool.clone(), schema)
            .await
            .expect("connect");
        let events = store.schema().events_table();
        let started = Instant::now();
        let chunk = 1_000_000;
        let mut from = 1;
        while from <= dispatched {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {events} (event_id, bucket, topic, key, payload, headers, dispatched_at)
                 SELECT gen_random_uuid(), g % 64, 't', convert_to('key-' || g % 500, 'UTF8'),
                        '\\x00', '\\x00000000', now() - interval '1 day'
                 FROM generate_series($1::int8, $2::int8) g"
            )))
            .bind(from)
            .bind((from + chunk - 1).min(dispatched))
            .execute(pool)
            .await
            .expect("insert");
            from += chunk;
        }
        if dispatched > 0 {
            eprintln!(
                "inserted {dispatched} dispatched rows in {:?}",
                started.elapsed()
            );
        }
        pending_and_analyze(pool, &events).await;
        let times = time_claims(&store, 200, 16, Duration::from_secs(10)).await;
        println!(
            "| {dispatched} | 200 | {:.2} | {:.2} |",
            times[100], times[197]
        );
        if dispatched > 0 {
            let retention = Retention::new(store.clone(), Duration::from_secs(3600))
                .with_batch_size(10_000)
                .with_max_batches_per_run(20);
            let start = Instant::now();
            let deleted = retention
                .run_once(&CancellationToken::new())
                .await
                .expect("retention");
            let took = start.elapsed();
            println!(
                "\nretention: {deleted} rows in 20 statements of 10,000 in {took:.1?} ({:.0} rows/s)\n",
                deleted as f64 / took.as_secs_f64()
            );
        }
        teardown(pool, &store).await;
    }
    claim_behind_a_parked_key(pool).await;
}

/// 1,000 pending events over 500 keys in `events`, then fresh statistics.
async fn pending_and_analyze(pool: &PgPool, events: &str) {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {events} (event_id, bucket, topic, key, payload, headers)
         SELECT gen_random_uuid(), g % 64, 't', convert_to('key-' || g % 500, 'UTF8'), '\\x00', '\\x00000000'
         FROM generate_series(1, 1000) g"
    )))
    .execute(pool)
    .await
    .expect("insert pending");
    sqlx::query(AssertSqlSafe(format!("VACUUM ANALYZE {events}")))
        .execute(pool)
        .await
        .expect("analyze");
}

/// `claims` claims of up to `buckets` buckets × 500 events, each released at once; their
/// times in milliseconds, sorted.
async fn time_claims(store: &PgStore, claims: usize, buckets: u32, hold: Duration) -> Vec<f64> {
    let mut times = Vec::with_capacity(claims);
    for _ in 0..claims {
        let start = Instant::now();
        let batch = store
            .claim(ClaimLimits {
                buckets,
                events: 500,
                hold_at_most: hold,
            })
            .await
            .expect("claim");
        assert!(!batch.records().is_empty());
        batch.commit(Vec::new()).await.expect("release");
        times.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    times
}

/// The claim's time when one parked key has `n` events behind it in one bucket, with 1,000
/// healthy pending events spread over the buckets. The rows behind it are written as
/// `enqueue` writes them behind a failed event (`waiting`), so the claim never reads them.
async fn claim_behind_a_parked_key(pool: &PgPool) {
    println!("\n| events behind a parked key | claim p50 ms | claim p99 ms |");
    println!("|---|---|---|");
    for behind in [0_i64, 10_000, 100_000, 1_000_000] {
        let name = format!("bench_parked_{}", EventId::new().as_uuid().simple());
        let schema = Schema::new(&name);
        migrate(pool, &schema, 64).await.expect("migrate");
        let store = PgStore::connect(pool.clone(), schema)
            .await
            .expect("connect");
        let events = store.schema().events_table();
        let hot = taskweave::outbox::bucket_of(b"hot", 64);
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {events} (event_id, bucket, topic, key, payload, headers, parked_at, attempts, waiting)
             SELECT gen_random_uuid(), $1, 't', 'hot', '\\x00', '\\x00000000',
                    CASE WHEN g = 0 THEN now() END, CASE WHEN g = 0 THEN 1 ELSE 0 END, g > 0
             FROM generate_series(0, $2::int8) g"
        )))
        .bind(i32::try_from(hot).expect("a bucket"))
        .bind(behind)
        .execute(pool)
        .await
        .expect("insert the parked key");
        pending_and_analyze(pool, &events).await;
        let times = time_claims(&store, 50, 64, Duration::from_secs(60)).await;
        println!("| {behind} | {:.2} | {:.2} |", times[25], times[49]);
        teardown(pool, &store).await;
    }
}

/// 1,000,000 events through 4 relays with 5 % of publishes failing (retriable), retention
/// on: what was lost, order violations, duplicates, dead tuples and memory over time.
async fn soak(pool: &PgPool) {
    const EVENTS: usize = 1_000_000;
    const SOAK_KEYS: usize = 2_000;
    let name = format!("bench_soak_{}", EventId::new().as_uuid().simple());
    let schema = Schema::new(&name);
    migrate(pool, &schema, 64).await.expect("migrate");
    let store = PgStore::connect(pool.clone(), schema)
        .await
        .expect("connect");
    let checker = Arc::new(OrderChecker::new(EVENTS, SOAK_KEYS));
    let token = CancellationToken::new();
    let relays: Vec<_> = (0..4)
        .map(|n| {
            let relay = Relay::new(
                store.clone(),
                Checking {
                    checker: checker.clone(),
                },
            )
            .with_name(format!("soak-{n}"))
            .with_buckets_per_batch(16)
            .with_retry(
                RetryPolicy::new()
                    .with_max_attempts(1_000)
                    .with_initial_delay(Duration::from_millis(50))
                    .with_max_delay(Duration::from_secs(1)),
            );
            tokio::spawn(relay.run(token.clone()))
        })
        .collect();
    let retention = Retention::new(store.clone(), Duration::from_secs(5))
        .with_period(Duration::from_secs(2))
        .with_batch_size(10_000)
        .spawn(token.clone());
    let start = Instant::now();
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let per_writer = EVENTS / 4;
                for chunk in 0..per_writer / 500 {
                    let batch = (0..500)
                        .map(|i| {
                            let n = w * per_writer + chunk * 500 + i;
                            Event::new("soak", format!("key-{}", n % SOAK_KEYS), vec![b'x'; 100])
                        })
                        .collect();
                    let mut tx = store.pool().begin().await.unwrap();
                    store.enqueue_batch(&mut tx, batch).await.unwrap();
                    store.commit(tx).await.unwrap();
                }
            })
        })
        .collect();
    println!("| t s | delivered | pending | n_dead_tup | n_live_tup | RSS MiB |");
    println!("|---|---|---|---|---|---|");
    let table = format!("{}events", "outbox_");
    let mut writers = Some(writers);
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (dead, live): (i64, i64) = sqlx::query_as(
            "SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2",
        )
        .bind(store.schema().schema())
        .bind(&table)
        .fetch_one(pool)
        .await
        .expect("stats");
        let pending = store.pending().await.unwrap();
        println!(
            "| {:.0} | {} | {pending} | {dead} | {live} | {:.1} |",
            start.elapsed().as_secs_f64(),
            checker.delivered.load(Ordering::Relaxed),
            rss_mib()
        );
        if let Some(done) = writers.take_if(|w| w.iter().all(|t| t.is_finished())) {
            for writer in done {
                writer.await.unwrap();
            }
        }
        if writers.is_none() && pending == 0 {
            break;
        }
    }
    let took = start.elapsed();
    token.cancel();
    let mut failed = 0;
    for relay in relays {
        failed += relay.await.unwrap().failed;
    }
    drop(retention.await);
    let lost = checker.missing(EVENTS);
    println!(
        "\nsoak: {EVENTS} events in {took:.1?} ({:.0}/s), {} delivered, {lost} lost, {} order violations, {} duplicates, {failed} failed attempts\n",
        EVENTS as f64 / took.as_secs_f64(),
        checker.delivered.load(Ordering::Relaxed),
        checker.violations.load(Ordering::Relaxed),
        checker.duplicates.load(Ordering::Relaxed),
    );
    teardown(pool, &store).await;
}

/// The process's resident memory.
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|kb| kb.trim().trim_end_matches(" kB").parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Checks first-delivery order per key as records are published, in fixed memory: one bit
/// per outbox id, and the highest sequence delivered per key.
struct OrderChecker {
    seen: Vec<std::sync::atomic::AtomicU8>,
    last: Mutex<HashMap<Vec<u8>, i64>>,
    delivered: AtomicU64,
    duplicates: AtomicU64,
    violations: AtomicU64,
    sends: AtomicU64,
}

impl OrderChecker {
    fn new(events: usize, keys: usize) -> Self {
        Self {
            seen: (0..events / 8 + 2).map(|_| Default::default()).collect(),
            last: Mutex::new(HashMap::with_capacity(keys)),
            delivered: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            violations: AtomicU64::new(0),
            sends: AtomicU64::new(0),
        }
    }

    /// Ids are 1..=events (a fresh table).
    fn record(&self, record: &OutboxRecord) {
        let id = usize::try_from(record.id).expect("positive");
        let bit = 1_u8 << (id % 8);
        let before = self.seen[id / 8].fetch_or(bit, Ordering::Relaxed);
        if before & bit != 0 {
            self.duplicates.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.delivered.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last.lock().unwrap();
        let previous = last.entry(record.key.clone()).or_insert(i64::MIN);
        if record.sequence < *previous {
            self.violations.fetch_add(1, Ordering::Relaxed);
        }
        *previous = (*previous).max(record.sequence);
    }

    /// Of ids `1..=events`, how many were never delivered.
    fn missing(&self, events: usize) -> usize {
        (1..=events)
            .filter(|id| self.seen[id / 8].load(Ordering::Relaxed) & (1 << (id % 8)) == 0)
            .count()
    }
}

/// The soak's publisher: 5 % of sends fail (retriable), the rest are checked and
/// acknowledged at once.
struct Checking {
    checker: Arc<OrderChecker>,
}

impl Publisher for Checking {
    type Delivery = std::future::Ready<Result<(), PublishError>>;

    async fn send(&self, record: &OutboxRecord) -> Result<Self::Delivery, PublishError> {
        let n = self.checker.sends.fetch_add(1, Ordering::Relaxed);
        if n % 20 == 7 {
            return Err(PublishError::retriable("injected: request timed out"));
        }
        self.checker.record(record);
        Ok(std::future::ready(Ok(())))
    }
}
