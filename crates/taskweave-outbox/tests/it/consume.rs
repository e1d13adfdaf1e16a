//! The consuming end against the real broker (tansu) and PostgreSQL: order per partition,
//! commits after handling, retries and the dead-letter topic, stops, rebalances, the inbox.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use taskweave_outbox::consume::{
    AbandonReason, ConsumeError, Consumer, DEAD_LETTER_ERROR_HEADER, DEAD_LETTER_ORIGIN_HEADER,
    DeadLetter, HandleError, Inbox, Received, RunningConsumer, StalePolicy,
};
use taskweave_outbox::{EVENT_ID_HEADER, KafkaPublisher, RetryPolicy, SEQUENCE_HEADER, Schema};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::support::{create_topic, kafka_brokers, pool, read_topic, unique_name};

/// A message to produce: key, payload, event id and sequence headers.
struct Out {
    key: String,
    payload: String,
    event_id: Option<String>,
    sequence: Option<i64>,
}

fn out(key: impl Into<String>, payload: impl Into<String>) -> Out {
    Out {
        key: key.into(),
        payload: payload.into(),
        event_id: Some(unique_name("ev")),
        sequence: None,
    }
}

fn producer() -> FutureProducer {
    KafkaPublisher::new(&kafka_brokers())
        .expect("producer")
        .producer()
}

async fn produce(topic: &str, messages: &[Out]) {
    let producer = producer();
    for m in messages {
        let mut headers = OwnedHeaders::new();
        if let Some(id) = &m.event_id {
            headers = headers.insert(Header {
                key: EVENT_ID_HEADER,
                value: Some(id.as_str()),
            });
        }
        let sequence = m.sequence.map(|s| s.to_string());
        if let Some(seq) = &sequence {
            headers = headers.insert(Header {
                key: SEQUENCE_HEADER,
                value: Some(seq.as_str()),
            });
        }
        producer
            .send(
                FutureRecord::to(topic)
                    .key(&m.key)
                    .payload(&m.payload)
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .expect("produced");
    }
}

/// A topic of `partitions` holding `n` messages (payloads "0", "1", …) over `keys` keys.
async fn keyed_topic(partitions: i32, n: usize, keys: usize) -> String {
    let topic = create_topic(partitions).await;
    let messages: Vec<Out> = (0..n)
        .map(|i| out(format!("k{}", i % keys), format!("{i}")))
        .collect();
    produce(&topic, &messages).await;
    topic
}

/// Waits (up to 60 s) until `done` holds.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "after 60 s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The group's committed offsets for `topic`'s partitions.
fn committed(group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let consumer: BaseConsumer = Consumer::config(&kafka_brokers(), group)
        .create()
        .expect("consumer");
    let mut list = TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition(topic, p);
    }
    let offsets = consumer
        .committed_offsets(list, Duration::from_secs(10))
        .expect("committed offsets");
    (0..partitions)
        .map(
            |p| match offsets.find_partition(topic, p).expect("listed").offset() {
                Offset::Offset(o) => o,
                _ => -1,
            },
        )
        .collect()
}

type Seen = Arc<Mutex<Vec<(i32, i64, String)>>>;

/// A handler that records (partition, offset, payload) and sleeps `work`.
fn recorder(
    seen: &Seen,
    work: Duration,
) -> impl Fn(Received) -> futures::future::BoxFuture<'static, Result<(), HandleError>>
+ Send
+ Sync
+ 'static {
    let seen = Arc::clone(seen);
    move |m: Received| {
        let seen = Arc::clone(&seen);
        Box::pin(async move {
            tokio::time::sleep(work).await;
            let payload = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            seen.lock()
                .unwrap()
                .push((m.partition(), m.offset(), payload));
            Ok(())
        })
    }
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy::new()
        .with_max_attempts(3)
        .with_initial_delay(Duration::from_millis(10))
        .with_max_delay(Duration::from_millis(50))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_in_parallel_each_in_order_and_committed_after_handling() {
    let topic = keyed_topic(3, 150, 15).await;
    let group = unique_name("g");
    let (running, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let seen: Seen = Arc::default();
    let record = recorder(&seen, Duration::from_millis(5));
    let (r, p) = (Arc::clone(&running), Arc::clone(&peak));
    let consumer = Consumer::new(&kafka_brokers(), &group, [topic.as_str()])
        .with_max_in_flight(2)
        .start(CancellationToken::new(), move |m: Received| {
            let now = r.fetch_add(1, Ordering::SeqCst) + 1;
            p.fetch_max(now, Ordering::SeqCst);
            let (done, r) = (record(m), Arc::clone(&r));
            async move {
                let result = done.await;
                r.fetch_sub(1, Ordering::SeqCst);
                result
            }
        })
        .await
        .expect("started");
    eventually("150 handled", || seen.lock().unwrap().len() >= 150).await;
    let report = consumer.stop_within(Duration::from_secs(10)).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.metrics.handled, 150, "{report}");

    let seen = seen.lock().unwrap().clone();
    let mut per_partition: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for (partition, offset, _) in &seen {
        per_partition.entry(*partition).or_default().push(*offset);
    }
    let mut ends = Vec::new();
    for p in 0..3 {
        let offsets = per_partition.remove(&p).unwrap_or_default();
        // In offset order, each once, from the beginning.
        assert_eq!(
            offsets,
            (0..offsets.len() as i64).collect::<Vec<_>>(),
            "partition {p}"
        );
        ends.push(offsets.len() as i64);
    }
    assert_eq!(ends.iter().sum::<i64>(), 150);
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= 2, "the in-flight limit of 2 was exceeded: {peak}");
    assert_eq!(peak, 2, "partitions were never handled in parallel");
    // Everything handled is committed at the stop: the next offset of each partition.
    assert_eq!(committed(&group, &topic, 3), ends);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_then_dead_lettered_and_the_partition_moves_on() {
    let topic = create_topic(1).await;
    let dead = create_topic(1).await;
    let payloads = ["a", "flaky", "b", "poison", "c", "panic", "d", "bad", "e"];
    let messages: Vec<Out> = (0..)
        .zip(payloads)
        .map(|(i, p)| Out {
            sequence: Some(i),
            ..out("k", p)
        })
        .collect();
    produce(&topic, &messages).await;
    let seen: Seen = Arc::default();
    let flaky_failures = Arc::new(AtomicUsize::new(0));
    let (s, f) = (Arc::clone(&seen), Arc::clone(&flaky_failures));
    let consumer = Consumer::new(&kafka_brokers(), &unique_name("g"), [topic.as_str()])
        .with_retry(fast_retry())
        .with_dead_letter(DeadLetter::new(producer(), &dead))
        .start(CancellationToken::new(), move |m: Received| {
            let (s, f) = (Arc::clone(&s), Arc::clone(&f));
            async move {
                let payload = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                match payload.as_str() {
                    "poison" => return Err(HandleError::retriable("poison never works")),
                    "bad" => return Err(HandleError::permanent("bad input")),
                    "panic" => panic!("handler exploded on {}", m.offset()),
                    "flaky" if f.fetch_add(1, Ordering::SeqCst) < 2 => {
                        return Err(HandleError::retriable("not yet"));
                    }
                    _ => {}
                }
                s.lock().unwrap().push((m.partition(), m.offset(), payload));
                Ok(())
            }
        })
        .await
        .expect("started");
    eventually("the last message handled", || {
        seen.lock().unwrap().iter().any(|(_, _, p)| p == "e")
    })
    .await;
    let report = consumer.stop_within(Duration::from_secs(10)).await;
    assert!(report.is_clean(), "{report}");
    let handled: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(_, _, p)| p.clone())
        .collect();
    assert_eq!(handled, ["a", "flaky", "b", "c", "d", "e"]);
    let m = &report.metrics;
    assert_eq!(m.dead_lettered, 3, "{report}");
    // flaky 2, poison 3, panic 3, bad 1 (permanent: no retry).
    assert_eq!(m.failed_attempts, 9, "{report}");
    assert_eq!(m.panics, 3, "{report}");
    assert_eq!(committed(&unique_name("other"), &topic, 1), [-1]);

    let letters =
        tokio::task::spawn_blocking(move || read_topic(&dead, 1, 3, Duration::from_millis(500)))
            .await
            .unwrap();
    let texts: Vec<(String, String, String)> = letters
        .iter()
        .map(|l| {
            let header = |name: &str| {
                l.headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_else(|| panic!("{name} missing"))
            };
            (
                String::from_utf8_lossy(&l.payload).into_owned(),
                header(DEAD_LETTER_ERROR_HEADER),
                header(DEAD_LETTER_ORIGIN_HEADER),
            )
        })
        .collect();
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert_eq!(texts[0].0, "poison");
    assert_eq!(texts[0].1, "poison never works");
    assert_eq!(texts[0].2, format!("{topic}/0/3"));
    assert_eq!(texts[1].0, "panic");
    assert!(
        texts[1].1.contains("handler exploded on 5"),
        "{}",
        texts[1].1
    );
    assert_eq!(texts[2].0, "bad");
    assert_eq!(texts[2].1, "bad input");
    // The original event id travels with the dead letter.
    assert_eq!(letters[0].event_id, messages[3].event_id.clone().unwrap());
}

/// A consumer whose handler blocks on `gate` at payload "slow", recording the rest.
async fn gated(group: &str, topic: &str, gate: &Arc<Notify>, seen: &Seen) -> RunningConsumer {
    let (gate, seen) = (Arc::clone(gate), Arc::clone(seen));
    Consumer::new(&kafka_brokers(), group, [topic])
        .start(CancellationToken::new(), move |m: Received| {
            let (gate, seen) = (Arc::clone(&gate), Arc::clone(&seen));
            async move {
                let payload = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                if payload == "slow" {
                    seen.lock()
                        .unwrap()
                        .push((m.partition(), m.offset(), "started".into()));
                    gate.notified().await;
                }
                seen.lock()
                    .unwrap()
                    .push((m.partition(), m.offset(), payload));
                Ok(())
            }
        })
        .await
        .expect("started")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_lets_the_handler_in_flight_finish_or_reports_it_and_commits_nothing_past_it() {
    let topic = create_topic(1).await;
    let payloads = ["a", "b", "slow", "c", "d"];
    produce(
        &topic,
        &payloads.iter().map(|p| out("k", *p)).collect::<Vec<_>>(),
    )
    .await;

    // Finishes within the budget: handled and committed; the queued rest is not.
    let group = unique_name("g");
    let (gate, seen): (Arc<Notify>, Seen) = (Arc::default(), Arc::default());
    let consumer = gated(&group, &topic, &gate, &seen).await;
    eventually("slow started", || {
        seen.lock().unwrap().iter().any(|s| s.2 == "started")
    })
    .await;
    let release = Arc::clone(&gate);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        release.notify_one();
    });
    let report = consumer.stop_within(Duration::from_secs(10)).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.metrics.handled, 3, "{report}");
    assert_eq!(committed(&group, &topic, 1), [3]);

    // Overruns the budget: reported, and the commit stops before it.
    let group = unique_name("g");
    let (gate, seen): (Arc<Notify>, Seen) = (Arc::default(), Arc::default());
    let consumer = gated(&group, &topic, &gate, &seen).await;
    eventually("slow started", || {
        seen.lock().unwrap().iter().any(|s| s.2 == "started")
    })
    .await;
    let report = consumer.stop_within(Duration::from_millis(300)).await;
    assert_eq!(report.abandoned.len(), 1, "{report}");
    assert_eq!(report.abandoned[0].offset, 2);
    assert_eq!(report.abandoned[0].reason, AbandonReason::Overran);
    assert!(report.final_commit.is_ok(), "{report}");
    assert_eq!(committed(&group, &topic, 1), [2]);
    gate.notify_one();

    // The group's next member starts at the abandoned message.
    let (gate, seen): (Arc<Notify>, Seen) = (Arc::default(), Arc::default());
    let consumer = gated(&group, &topic, &gate, &seen).await;
    eventually("slow started again", || {
        seen.lock().unwrap().iter().any(|s| s.2 == "started")
    })
    .await;
    gate.notify_one();
    eventually("d handled", || {
        seen.lock().unwrap().iter().any(|s| s.2 == "d")
    })
    .await;
    let report = consumer.stop_within(Duration::from_secs(10)).await;
    assert!(report.is_clean(), "{report}");
    let offsets: Vec<i64> = seen.lock().unwrap().iter().map(|s| s.1).collect();
    assert_eq!(offsets, [2, 2, 3, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_commits_what_finished_and_the_new_member_goes_on_from_there() {
    let topic = keyed_topic(4, 400, 20).await;
    let group = unique_name("g");
    let (first_seen, second_seen): (Seen, Seen) = (Arc::default(), Arc::default());
    // Heartbeats every 200 ms: the first member hears of the second one soon.
    let member = |name: &str| {
        let mut config = Consumer::config(&kafka_brokers(), &group);
        config.set("heartbeat.interval.ms", "200");
        Consumer::from_config(config, [topic.as_str()]).with_name(name)
    };
    let first = member("first")
        .start(
            CancellationToken::new(),
            recorder(&first_seen, Duration::from_millis(25)),
        )
        .await
        .expect("first started");
    eventually("the first member handling", || {
        first_seen.lock().unwrap().len() >= 20
    })
    .await;
    let second = member("second")
        .start(
            CancellationToken::new(),
            recorder(&second_seen, Duration::from_millis(25)),
        )
        .await
        .expect("second started");
    let all = |a: &Seen, b: &Seen| {
        let mut set: HashSet<(i32, i64)> = HashSet::new();
        for s in a.lock().unwrap().iter().chain(b.lock().unwrap().iter()) {
            set.insert((s.0, s.1));
        }
        set.len()
    };
    eventually("400 handled between them", || {
        all(&first_seen, &second_seen) >= 400
    })
    .await;
    let (a, b) = tokio::join!(
        first.stop_within(Duration::from_secs(10)),
        second.stop_within(Duration::from_secs(10))
    );
    assert!(a.is_clean() && b.is_clean(), "{a}\n{b}");
    assert!(
        a.metrics.revoked >= 1,
        "the first member never gave up a partition: {a}"
    );
    assert!(
        b.metrics.handled > 0,
        "the second member handled nothing: {b}"
    );
    // Per member and partition, in offset order; and nobody handled a message twice: the
    // revocation committed what the first member finished.
    let mut count: HashMap<(i32, i64), usize> = HashMap::new();
    for seen in [&first_seen, &second_seen] {
        let mut last: HashMap<i32, i64> = HashMap::new();
        for (p, o, _) in seen.lock().unwrap().iter() {
            if let Some(prev) = last.insert(*p, *o) {
                assert!(prev < *o, "partition {p}: {o} after {prev}");
            }
            *count.entry((*p, *o)).or_default() += 1;
        }
    }
    let twice: Vec<_> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "handled twice: {twice:?}");
    assert_eq!(count.len(), 400);
}

type Apply = dyn for<'c> Fn(&'c mut sqlx::PgConnection, &'c Received) -> BoxFuture<'c, Result<(), HandleError>>
    + Send
    + Sync;

/// The inbox handler of the test: upserts the product, counting its applications.
fn apply_products(products: String) -> Arc<Apply> {
    Arc::new(move |tx: &mut sqlx::PgConnection, m: &Received| {
        let sql = format!(
            "INSERT INTO {products} (key, name, applied) VALUES ($1, $2, 1)
             ON CONFLICT (key) DO UPDATE SET name = EXCLUDED.name, applied = {products}.applied + 1"
        );
        let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        let name = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
        Box::pin(async move {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(key)
                .bind(name)
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_applies_an_event_once_across_redeliveries_and_skips_stale_ones() {
    let db = pool(4).await;
    let schema = Schema::new(&unique_name("inbox"));
    Inbox::migrate(&db, &schema).await.expect("migrate");
    Inbox::migrate(&db, &schema).await.expect("migrate twice");
    let products = format!("\"{}\".products", schema.schema());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {products} (key text PRIMARY KEY, name text NOT NULL, applied int NOT NULL)"
    )))
    .execute(&db)
    .await
    .unwrap();

    let topic = create_topic(2).await;
    let dead = create_topic(1).await;
    let mut messages: Vec<Out> = (0..20)
        .map(|i| Out {
            sequence: Some(i),
            ..out(format!("p{}", i % 5), format!("name-{i}"))
        })
        .collect();
    // An older state of p0 after its newer ones, and a message without an event id.
    messages.push(Out {
        sequence: Some(1),
        ..out("p0", "stale")
    });
    messages.push(Out {
        event_id: None,
        ..out("p1", "anonymous")
    });
    produce(&topic, &messages).await;

    let apply = apply_products(products.clone());
    let run = |group: String, inbox: Inbox| {
        let (topic, dead, apply) = (topic.clone(), dead.clone(), apply.clone());
        async move {
            let stats = inbox.clone();
            let consumer = Consumer::new(&kafka_brokers(), &group, [topic.as_str()])
                .with_retry(fast_retry())
                .with_dead_letter(DeadLetter::new(producer(), &dead))
                .start(
                    CancellationToken::new(),
                    inbox.handler(move |tx, m| apply(tx, m)),
                )
                .await
                .expect("started");
            eventually("every message seen", || {
                let s = stats.stats();
                let m = consumer.metrics();
                s.applied + s.duplicates + s.stale >= 21 && m.dead_lettered == 1
            })
            .await;
            let report = consumer.stop_within(Duration::from_secs(10)).await;
            assert!(report.is_clean(), "{report}");
            stats.stats()
        }
    };
    let inbox = Inbox::new(db.clone(), &schema, "products").with_stale_policy(StalePolicy::Skip);
    let first = run(unique_name("g"), inbox.clone()).await;
    assert_eq!((first.applied, first.duplicates, first.stale), (20, 0, 1));
    let rows: Vec<(String, String, i32)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT key, name, applied FROM {products} ORDER BY key"
    )))
    .fetch_all(&db)
    .await
    .unwrap();
    assert_eq!(rows.len(), 5);
    for (key, name, applied) in &rows {
        assert_eq!(*applied, 4, "{key}");
        let last = 15 + key[1..].parse::<i32>().unwrap();
        assert_eq!(
            name,
            &format!("name-{last}"),
            "the stale state must not win"
        );
    }
    assert!(
        inbox
            .contains(messages[0].event_id.as_deref().unwrap())
            .await
            .unwrap()
    );

    // Every event again (a new group reads from the beginning: a redelivery of all of
    // them): nothing changes.
    let again = Inbox::new(db.clone(), &schema, "products").with_stale_policy(StalePolicy::Skip);
    let second = run(unique_name("g"), again).await;
    assert_eq!(
        (second.applied, second.duplicates, second.stale),
        (0, 21, 0)
    );
    let after: Vec<(String, String, i32)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT key, name, applied FROM {products} ORDER BY key"
    )))
    .fetch_all(&db)
    .await
    .unwrap();
    assert_eq!(after, rows);
    assert_eq!(inbox.purge_before(Duration::ZERO, 1000).await.unwrap(), 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_refuses_unreachable_brokers_and_unknown_topics_clearly() {
    let unreachable = Consumer::new("127.0.0.1:1", "g", ["t"])
        .with_startup_timeout(Duration::from_millis(500))
        .start(CancellationToken::new(), |_m: Received| async { Ok(()) })
        .await
        .unwrap_err();
    assert!(
        matches!(unreachable, ConsumeError::Unreachable { .. }),
        "{unreachable}"
    );
    assert!(
        unreachable.to_string().contains("127.0.0.1:1"),
        "{unreachable}"
    );
    let missing = unique_name("missing");
    let unknown = Consumer::new(&kafka_brokers(), "g", [missing.as_str()])
        .start(CancellationToken::new(), |_m: Received| async { Ok(()) })
        .await
        .unwrap_err();
    assert!(
        matches!(&unknown, ConsumeError::UnknownTopic(t) if *t == missing),
        "{unknown}"
    );
    let none = Consumer::new(&kafka_brokers(), "g", Vec::<String>::new())
        .start(CancellationToken::new(), |_m: Received| async { Ok(()) })
        .await
        .unwrap_err();
    assert!(matches!(none, ConsumeError::Invalid(_)), "{none}");
    // A configuration that would let librdkafka commit by itself: refused before anything
    // is fetched.
    for (setting, value) in [
        ("enable.auto.commit", "true"),
        ("enable.auto.offset.store", "true"),
    ] {
        let mut config = Consumer::config(&kafka_brokers(), "g");
        config.set(setting, value);
        let refused = Consumer::from_config(config, [missing.as_str()])
            .start(CancellationToken::new(), |_m: Received| async { Ok(()) })
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, ConsumeError::Invalid(why) if why.contains(setting)),
            "{refused}"
        );
    }
    let mut unset = rdkafka::ClientConfig::new();
    unset
        .set("bootstrap.servers", kafka_brokers())
        .set("group.id", "g");
    let refused = Consumer::from_config(unset, [missing.as_str()])
        .start(CancellationToken::new(), |_m: Received| async { Ok(()) })
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, ConsumeError::Invalid(why) if why.contains("enable.auto.commit")),
        "librdkafka's defaults commit by themselves: {refused}"
    );
}

/// Produces `payloads` to one partition of `topic`, with event ids.
async fn produce_to(topic: &str, partition: i32, payloads: &[&str]) {
    let producer = producer();
    for payload in payloads {
        let id = unique_name("ev");
        let headers = OwnedHeaders::new().insert(Header {
            key: EVENT_ID_HEADER,
            value: Some(id.as_str()),
        });
        producer
            .send(
                FutureRecord::to(topic)
                    .partition(partition)
                    .key("k")
                    .payload(*payload)
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .expect("produced");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_partitions_are_paused_and_resumed_without_losing_or_repeating_a_message() {
    // librdkafka prefetches far ahead; pausing a partition drops what it fetched, and the
    // resume must start again exactly after the last message routed, which is inside a
    // record batch. On rdkafka's mock cluster: tansu 0.6.0 answers a fetch from an offset
    // inside a record batch with nothing when that batch is the partition's last, where
    // Kafka (and the mock cluster) return the batch (../shared/notes/outbox.md).
    let mock = MockCluster::new(1).expect("mock cluster");
    let topic = unique_name("paused");
    mock.create_topic(&topic, 3, 1).expect("topic");
    let brokers = mock.bootstrap_servers();
    let mut config = KafkaPublisher::config(&brokers);
    config.set("linger.ms", "20");
    let producer: FutureProducer = config.create().expect("producer");
    let mut acks = Vec::new();
    for i in 0..3000 {
        let record = FutureRecord::to(&topic)
            .partition(i % 3)
            .key("k")
            .payload("x");
        acks.push(producer.send_result(record).expect("queued"));
    }
    for ack in acks {
        ack.await.expect("delivered").expect("acknowledged");
    }
    let seen: Seen = Arc::default();
    let consumer = Consumer::new(&brokers, &unique_name("g"), [topic.as_str()])
        .with_max_queued_per_partition(40)
        .start(CancellationToken::new(), recorder(&seen, Duration::ZERO))
        .await
        .expect("started");
    eventually("3000 handled", || seen.lock().unwrap().len() >= 3000).await;
    // Anything repeated would come within a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = consumer.stop_within(Duration::from_secs(10)).await;
    assert!(report.is_clean(), "{report}");
    assert!(
        report.metrics.pauses >= 3,
        "the queues never filled: {report}"
    );
    let seen = seen.lock().unwrap().clone();
    for p in 0..3 {
        let offsets: Vec<i64> = seen.iter().filter(|s| s.0 == p).map(|s| s.1).collect();
        assert_eq!(offsets, (0..1000).collect::<Vec<i64>>(), "partition {p}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_before_its_first_await_counts_as_a_failure() {
    let topic = create_topic(1).await;
    let dead = create_topic(1).await;
    produce_to(&topic, 0, &["boom", "fine"]).await;
    let seen: Seen = Arc::default();
    let record = recorder(&seen, Duration::ZERO);
    let consumer = Consumer::new(&kafka_brokers(), &unique_name("g"), [topic.as_str()])
        .with_retry(fast_retry())
        .with_dead_letter(DeadLetter::new(producer(), &dead))
        .start(CancellationToken::new(), move |m: Received| {
            assert!(
                m.payload() != Some(b"boom".as_slice()),
                "panicked while building the future"
            );
            record(m)
        })
        .await
        .expect("started");
    eventually("fine handled", || seen.lock().unwrap().len() == 1).await;
    let report = consumer.stop_within(Duration::from_secs(10)).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(
        (report.metrics.panics, report.metrics.dead_lettered),
        (3, 1),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_refuses_a_commit_after_a_swallowed_database_error() {
    let db = pool(2).await;
    let schema = Schema::new(&unique_name("inbox"));
    Inbox::migrate(&db, &schema).await.expect("migrate");
    let inbox = Inbox::new(db.clone(), &schema, "swallow");
    let handler = inbox.clone().handler(|tx, _m| {
        Box::pin(async move {
            // An error the handler ignores: the transaction is aborted from here on.
            let _ = sqlx::query("SELECT 1/0").execute(&mut *tx).await;
            Ok(())
        })
    });
    let message = Received::new(
        "t",
        0,
        0,
        Some(b"k".to_vec()),
        Some(b"x".to_vec()),
        vec![(EVENT_ID_HEADER.to_owned(), b"swallowed-1".to_vec())],
    );
    use taskweave_outbox::consume::Handler as _;
    let error = handler.handle(message).await.unwrap_err();
    assert!(error.message().contains("aborted"), "{error}");
    assert!(
        !inbox.contains("swallowed-1").await.unwrap(),
        "nothing may be recorded"
    );
    assert_eq!(inbox.stats().applied, 0);
}

/// Polls `future` up to `polls` times, a millisecond apart (it may finish sooner), then drops
/// it.
async fn cut_off<F: std::future::Future>(mut future: std::pin::Pin<&mut F>, polls: usize) {
    for poll in 0..polls {
        if futures::poll!(future.as_mut()).is_ready() {
            return;
        }
        if poll + 1 < polls {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// One connection in the pool: an inbox future (its migration, its handler) dropped at
/// any await point, `BEGIN` and `COMMIT` in flight included, must not hand it back inside a
/// transaction (sqlx issue 4393 with `Pool::begin`), or every later use would run in that
/// transaction and never commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_future_dropped_halfway_never_returns_its_connection_inside_a_transaction() {
    let name = unique_name("inboxdrop");
    // No ping before a connection is handed out, so that the first poll of a call takes
    // the idle connection and sends `BEGIN`: dropped then, the call is cut off while
    // `BEGIN` is in flight, the case `Pool::begin` gets wrong.
    let db = crate::support::pool_with(
        1,
        &name,
        sqlx::postgres::PgPoolOptions::new().test_before_acquire(false),
    )
    .await;
    let observer = pool(1).await;
    let schema = Schema::new(&name);
    Inbox::migrate(&db, &schema).await.expect("migrate");
    let inbox = Inbox::new(db.clone(), &schema, "dropped");
    let handler = inbox.clone().handler(|tx, _m| {
        Box::pin(async move {
            sqlx::query("SELECT 1").execute(&mut *tx).await?;
            Ok(())
        })
    });
    let message = |id: usize| {
        Received::new(
            "t",
            0,
            i64::try_from(id).unwrap(),
            Some(b"k".to_vec()),
            Some(b"x".to_vec()),
            vec![(
                EVENT_ID_HEADER.to_owned(),
                format!("dropped-{id}").into_bytes(),
            )],
        )
    };
    use taskweave_outbox::consume::Handler as _;
    // Cut off after one poll (`BEGIN` in flight), then after more polls with a wait between
    // them, which land on the later statements.
    for (id, polls) in [1_usize, 1, 2, 3, 4, 6, 8].into_iter().enumerate() {
        let cut = format!("{polls} polls");
        cut_off(std::pin::pin!(Inbox::migrate(&db, &schema)), polls).await;
        cut_off(std::pin::pin!(handler.handle(message(id))), polls).await;
        // A connection dropped inside its transaction is closed; the server ends its session
        // when it notices, a moment later. One handed back to the pool stays for good.
        let start = std::time::Instant::now();
        loop {
            if crate::support::sessions_in_transaction(&observer, &name).await == 0 {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "a pooled connection was left inside a transaction (cut after {cut})"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // The pool's connection (or its replacement) still commits.
    handler.handle(message(100)).await.expect("handled");
    assert!(inbox.contains("dropped-100").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_stops_as_a_shutdown_phase_and_commits() {
    let topic = create_topic(2).await;
    produce_to(&topic, 0, &["a", "b"]).await;
    produce_to(&topic, 1, &["c"]).await;
    let group = unique_name("g");
    let seen: Seen = Arc::default();
    let consumer = Consumer::new(&kafka_brokers(), &group, [topic.as_str()])
        .start(CancellationToken::new(), recorder(&seen, Duration::ZERO))
        .await
        .expect("started");
    eventually("3 handled", || seen.lock().unwrap().len() >= 3).await;
    let shutdown =
        taskweave_shutdown::Shutdown::new(CancellationToken::new(), Duration::from_secs(10));
    assert!(consumer.register_phase(&shutdown, "product consumer"));
    let report = shutdown.run_now("test").await;
    assert!(report.is_clean(), "{report}");
    assert!(
        report
            .step("product consumer")
            .unwrap()
            .status
            .is_completed(),
        "{report}"
    );
    assert_eq!(committed(&group, &topic, 2), [2, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_gives_up_an_overrunning_handler_uncommitted_and_never_doubles_a_partition() {
    let topic = create_topic(2).await;
    produce_to(&topic, 0, &["a0", "slow", "b0", "c0"]).await;
    produce_to(&topic, 1, &["a1", "b1", "c1"]).await;
    let group = unique_name("g");
    let gate = Arc::new(Notify::new());
    let held = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Handlers running now, per consumer and partition: never above one.
    let running: Arc<Mutex<HashMap<(usize, i32), usize>>> = Arc::default();
    let doubled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen: Seen = Arc::default();
    let member = |n: usize| {
        let (gate, held, running, doubled, seen) = (
            Arc::clone(&gate),
            Arc::clone(&held),
            Arc::clone(&running),
            Arc::clone(&doubled),
            Arc::clone(&seen),
        );
        let mut config = Consumer::config(&kafka_brokers(), &group);
        config.set("heartbeat.interval.ms", "200");
        Consumer::from_config(config, [topic.as_str()])
            .with_name(format!("member-{n}"))
            .with_revoke_timeout(Duration::from_millis(300))
            .start(CancellationToken::new(), move |m: Received| {
                let (gate, held, running, doubled, seen) = (
                    Arc::clone(&gate),
                    Arc::clone(&held),
                    Arc::clone(&running),
                    Arc::clone(&doubled),
                    Arc::clone(&seen),
                );
                async move {
                    let slot = (n, m.partition());
                    {
                        let mut running = running.lock().unwrap();
                        let now = running.entry(slot).or_default();
                        *now += 1;
                        if *now > 1 {
                            doubled.store(true, Ordering::SeqCst);
                        }
                    }
                    let payload =
                        String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                    // The first attempt of "slow" waits for the gate; later ones go through.
                    if payload == "slow" && !held.swap(true, Ordering::SeqCst) {
                        gate.notified().await;
                    }
                    seen.lock()
                        .unwrap()
                        .push((m.partition(), m.offset(), payload));
                    *running.lock().unwrap().get_mut(&slot).unwrap() -= 1;
                    Ok(())
                }
            })
    };
    let first = member(1).await.expect("first started");
    eventually("slow started", || held.load(Ordering::SeqCst)).await;
    let second = member(2).await.expect("second started");
    eventually("the first member's partitions revoked", || {
        first.metrics().revoked >= 1
    })
    .await;
    // The revocation gave up on "slow" after 300 ms; only now does its handler end.
    tokio::time::sleep(Duration::from_millis(500)).await;
    gate.notify_one();
    eventually("every message handled", || {
        let seen = seen.lock().unwrap();
        let set: HashSet<(i32, i64)> = seen.iter().map(|s| (s.0, s.1)).collect();
        set.len() >= 7
    })
    .await;
    let (a, b) = tokio::join!(
        first.stop_within(Duration::from_secs(10)),
        second.stop_within(Duration::from_secs(10))
    );
    assert!(
        a.abandoned
            .iter()
            .any(|x| x.partition == 0 && x.offset == 1 && x.reason == AbandonReason::Overran),
        "{a}"
    );
    assert!(b.is_clean(), "{b}");
    assert!(
        !doubled.load(Ordering::SeqCst),
        "a partition had two handlers at once in one member"
    );
    // "slow" was handled again after the hand-over (it was never committed), then the rest.
    let seen = seen.lock().unwrap().clone();
    let slow = seen.iter().filter(|s| s.2 == "slow").count();
    assert_eq!(slow, 2, "{seen:?}");
    assert_eq!(committed(&group, &topic, 2), [4, 3]);
}
