//! The outbox's consuming end against the loops people write by hand on rdkafka, on the
//! same broker (and PostgreSQL for the inbox rows).
//!
//! Not a criterion bench: it measures a whole system (messages per second through a
//! consumer group, from the first message handled to the last), so it is a plain program
//! that prints a table. It needs the services:
//!
//! ```sh
//! eval "$(scripts/services start)"
//! cargo bench -p taskweave-benches --bench consume            # three runs
//! cargo bench -p taskweave-benches --bench consume -- --runs 1
//! ```
//!
//! The rows, each on a fresh consumer group reading one 6-partition topic from the start:
//!
//! - **no-op handler**: rdkafka's `StreamConsumer` in one loop, `store_offset` after each
//!   message and librdkafka's auto-commit (the usual at-least-once loop), against
//!   `Consumer` (a worker per partition, batched commits).
//! - **1 ms handler** (a call to another service): the same loop, awaiting the handler in
//!   turn, against `Consumer` with up to 16 handlers at once (per-partition order kept).
//! - **inbox**: per message, a transaction that inserts the event id (`ON CONFLICT DO
//!   NOTHING`) and a row, written by hand in the loop, against `Inbox::handler` on
//!   `Consumer`.

#[path = "services.rs"]
mod services;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use sqlx::{AssertSqlSafe, PgPool};
use taskweave::outbox::consume::{Consumer, HandleError, Inbox, Received};
use taskweave::outbox::{KafkaPublisher, Schema};
use tokio_util::sync::CancellationToken;

const PARTITIONS: i32 = 6;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(services::Services {
        runs,
        pool,
        brokers,
    }) = services::connect("consume", 20).await
    else {
        return;
    };
    let tag = format!("{}_{}", std::process::id(), now_nanos());
    let big = format!("consume-bench-{tag}-big");
    let small = format!("consume-bench-{tag}-small");
    create_topics(&brokers, &[&big, &small]).await;
    produce(&brokers, &big, 20_000).await;
    produce(&brokers, &small, 3_000).await;

    println!("| run | handler | consumer | messages | messages/s | ratio |");
    println!("|---|---|---|---|---|---|");
    for run in 1..=runs {
        let peer = hand_loop(&brokers, &big, 20_000, Work::None).await;
        let ours = taskweave_consumer(&brokers, &big, 20_000, Work::None).await;
        println!(
            "| {run} | no-op | rdkafka loop, store_offset + auto-commit | 20000 | {peer:.0} | |"
        );
        println!(
            "| {run} | no-op | taskweave Consumer | 20000 | {ours:.0} | {:.2} × |",
            ours / peer
        );
        let peer = hand_loop(&brokers, &small, 3_000, Work::Sleep).await;
        let ours = taskweave_consumer(&brokers, &small, 3_000, Work::Sleep).await;
        println!(
            "| {run} | 1 ms | rdkafka loop, store_offset + auto-commit | 3000 | {peer:.0} | |"
        );
        println!(
            "| {run} | 1 ms | taskweave Consumer, 16 in flight | 3000 | {ours:.0} | {:.2} × |",
            ours / peer
        );
        let schema = Schema::new(&format!("consume_bench_{tag}_{run}"));
        Inbox::migrate(&pool, &schema).await.expect("inbox tables");
        let table = format!("\"{}\".applied", schema.schema());
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {table} (event_id text NOT NULL, partition integer NOT NULL)"
        )))
        .execute(&pool)
        .await
        .expect("table");
        let peer = hand_loop(
            &brokers,
            &small,
            3_000,
            Work::Inbox(pool.clone(), schema.clone()),
        )
        .await;
        let ours =
            taskweave_consumer(&brokers, &small, 3_000, Work::Inbox(pool.clone(), schema)).await;
        println!(
            "| {run} | inbox row + insert | rdkafka loop, one transaction each | 3000 | {peer:.0} | |"
        );
        println!(
            "| {run} | inbox row + insert | taskweave Consumer + Inbox | 3000 | {ours:.0} | {:.2} × |",
            ours / peer
        );
    }
}

fn now_nanos() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .subsec_nanos()
}

#[derive(Clone)]
enum Work {
    None,
    Sleep,
    Inbox(PgPool, Schema),
}

async fn create_topics(brokers: &str, names: &[&str]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin");
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| NewTopic::new(n, PARTITIONS, TopicReplication::Fixed(1)))
        .collect();
    for result in admin
        .create_topics(&topics, &AdminOptions::new())
        .await
        .expect("the broker")
    {
        result.expect("topic created");
    }
}

async fn produce(brokers: &str, topic: &str, n: usize) {
    let mut config = KafkaPublisher::config(brokers);
    // One message per record batch: tansu 0.6.0 answers a fetch from an offset inside the
    // partition's last record batch with nothing (Kafka returns the batch), which stalls
    // any consumer that resumes or restarts mid-batch.
    config
        .set("linger.ms", "0")
        .set("batch.num.messages", "1")
        .set("message.timeout.ms", "300000");
    let producer: FutureProducer = config.create().expect("producer");
    let payload = vec![b'x'; 100];
    let mut acks = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("{topic}-{i}");
        let key = format!("k{}", i % 600);
        let headers = OwnedHeaders::new().insert(Header {
            key: "event_id",
            value: Some(id.as_str()),
        });
        let record = FutureRecord::to(topic)
            .key(&key)
            .payload(&payload)
            .headers(headers);
        acks.push(producer.send_result(record).expect("queued"));
    }
    for ack in acks {
        ack.await.expect("delivered").expect("acknowledged");
    }
    producer.flush(Duration::from_secs(30)).expect("flushed");
}

/// From the first message handled to the `n`-th.
#[derive(Default)]
struct Clock {
    handled: AtomicU64,
    first: std::sync::OnceLock<Instant>,
    last: std::sync::Mutex<Option<Instant>>,
}

impl Clock {
    fn tick(&self) {
        self.first.get_or_init(Instant::now);
        self.handled.fetch_add(1, Ordering::Relaxed);
        *self.last.lock().unwrap() = Some(Instant::now());
    }

    fn rate(&self) -> f64 {
        let (first, last) = (self.first.get().copied(), *self.last.lock().unwrap());
        let elapsed = last.zip(first).map(|(l, f)| l - f).unwrap_or_default();
        self.handled.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64().max(1e-9)
    }
}

/// The user's work for one message, on the inbox's connection when there is one.
async fn work(work: &Work, event_id: &str, partition: i32) -> Result<(), HandleError> {
    match work {
        Work::None => Ok(()),
        Work::Sleep => {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok(())
        }
        Work::Inbox(pool, schema) => {
            // The hand-written inbox: the same statements `Inbox` runs.
            let mut tx = pool.begin().await?;
            let recorded = sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO \"{}\".outbox_inbox (consumer, event_id, topic, \"partition\", \"offset\")
                 VALUES ('hand', $1, 't', $2, 0) ON CONFLICT DO NOTHING",
                schema.schema()
            )))
            .bind(event_id)
            .bind(partition)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if recorded == 1 {
                insert_applied(&mut tx, schema, event_id, partition).await?;
            }
            tx.commit().await?;
            Ok(())
        }
    }
}

async fn insert_applied(
    tx: &mut sqlx::PgConnection,
    schema: &Schema,
    event_id: &str,
    partition: i32,
) -> Result<(), sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{}\".applied (event_id, partition) VALUES ($1, $2)",
        schema.schema()
    )))
    .bind(event_id)
    .bind(partition)
    .execute(&mut *tx)
    .await
    .map(|_| ())
}

/// The usual loop: one `StreamConsumer`, the handler awaited in turn, `store_offset`
/// after it, librdkafka's auto-commit every second.
async fn hand_loop(brokers: &str, topic: &str, n: u64, job: Work) -> f64 {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("hand-{}", now_nanos()))
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribed");
    let clock = Clock::default();
    let mut stream = consumer.stream();
    while clock.handled.load(Ordering::Relaxed) < n {
        let message = stream.next().await.expect("a stream").expect("a message");
        let event_id = message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == "event_id"))
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        work(&job, &event_id, message.partition())
            .await
            .expect("handled");
        consumer
            .store_offset_from_message(&message)
            .expect("stored");
        clock.tick();
    }
    drop(stream);
    clock.rate()
}

async fn taskweave_consumer(brokers: &str, topic: &str, n: u64, job: Work) -> f64 {
    let clock = Arc::new(Clock::default());
    let group = format!("ours-{}", now_nanos());
    let consumer = Consumer::new(brokers, &group, [topic]).with_max_in_flight(16);
    let running = match job {
        Work::Inbox(pool, schema) => {
            let inbox = Inbox::new(pool, &schema, "ours");
            let tick = Arc::clone(&clock);
            consumer
                .start(
                    CancellationToken::new(),
                    inbox.handler(move |tx, m: &Received| {
                        let tick = Arc::clone(&tick);
                        let schema = schema.clone();
                        Box::pin(async move {
                            let id = m.event_id().unwrap_or_default().to_owned();
                            insert_applied(tx, &schema, &id, m.partition()).await?;
                            tick.tick();
                            Ok(())
                        })
                    }),
                )
                .await
        }
        job => {
            let tick = Arc::clone(&clock);
            consumer
                .start(CancellationToken::new(), move |m: Received| {
                    let (tick, job) = (Arc::clone(&tick), job.clone());
                    async move {
                        work(&job, m.event_id().unwrap_or_default(), m.partition()).await?;
                        tick.tick();
                        Ok(())
                    }
                })
                .await
        }
    }
    .expect("started");
    let start = Instant::now();
    while clock.handled.load(Ordering::Relaxed) < n {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "stuck at {} of {n}: {:?}",
            clock.handled.load(Ordering::Relaxed),
            running.metrics()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = running.stop_within(Duration::from_secs(10)).await;
    assert!(report.is_clean(), "{report}");
    clock.rate()
}
