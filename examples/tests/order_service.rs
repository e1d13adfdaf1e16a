//! Process tests of `examples/order_service.rs`: the built example runs as a child process
//! on the real PostgreSQL and the real broker that `scripts/test` starts, and receives real
//! signals. `cargo test` builds the examples before it runs the tests.
//!
//! Each test gives its service a schema and a topic prefix of its own.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

fn example_binary() -> PathBuf {
    // target/<profile>/deps/order_service-<hash> → target/<profile>/examples/order_service
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let binary = profile_dir
        .join("examples")
        .join(format!("order_service{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.exists(),
        "{} is missing: run `cargo test` (which builds the examples) or `cargo build --example order_service`",
        binary.display()
    );
    binary
}

fn env(name: &str) -> String {
    std::env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| {
        panic!(
            "{name} is not set: these tests run the service on the real PostgreSQL and broker; start them with `eval \"$(scripts/services start)\"` and export DATABASE_URL KAFKA_BROKERS (scripts/test does this)"
        )
    })
}

fn brokers() -> String {
    env("KAFKA_BROKERS")
}

/// A schema and topic prefix no other test (or run) uses.
#[derive(Clone)]
struct Names {
    schema: String,
    prefix: String,
    /// The product consumer's group: one per test, so that tests running at once do not
    /// rebalance each other's consumers.
    group: String,
}

fn names() -> Names {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .subsec_nanos();
    let tag = format!("{}_{n}_{nanos}", std::process::id());
    Names {
        schema: format!("os_{tag}"),
        prefix: format!("os{tag}-"),
        group: format!("os{tag}-products"),
    }
}

struct Service {
    child: Child,
    addr: String,
    // Read on threads from the start, so that a full pipe never blocks the child.
    stdout: Option<thread::JoinHandle<String>>,
    stderr: Option<thread::JoinHandle<String>>,
}

impl Service {
    fn start(names: &Names, args: &[&str]) -> Service {
        let mut child = Command::new(example_binary())
            .args(["--addr", "127.0.0.1:0", "--schema", &names.schema])
            .args(["--topic-prefix", &names.prefix])
            .args(["--group", &names.group])
            .args(args)
            .env("DATABASE_URL", env("DATABASE_URL"))
            .env("KAFKA_BROKERS", brokers())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the example starts");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut stderr = child.stderr.take().expect("piped stderr");
        let stderr = thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the first line");
        let stdout = thread::spawn(move || {
            let mut text = String::new();
            let _ = stdout.read_to_string(&mut text);
            text
        });
        let Some(addr) = line
            .strip_prefix("listening on ")
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_owned)
        else {
            let _ = child.wait();
            panic!(
                "unexpected first line: {line:?}; stderr:\n{}",
                stderr.join().unwrap()
            );
        };
        Service {
            child,
            addr,
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits for the process to exit (at most `limit`), returning its status, the time it
    /// took, its stdout after the first line and its stderr.
    fn wait(mut self, limit: Duration) -> (ExitStatus, Duration, String, String) {
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                started.elapsed() <= limit,
                "the service did not exit within {limit:?}"
            );
            thread::sleep(Duration::from_millis(10));
        };
        let elapsed = started.elapsed();
        let out = self
            .stdout
            .take()
            .map(|t| t.join().unwrap())
            .unwrap_or_default();
        let err = self
            .stderr
            .take()
            .map(|t| t.join().unwrap())
            .unwrap_or_default();
        (status, elapsed, out, err)
    }

    /// SIGTERM, then the exit, which must be 0 within `limit`; returns stdout.
    fn stop(self, limit: Duration) -> String {
        self.signal("TERM");
        let (status, _, stdout, stderr) = self.wait(limit);
        assert_eq!(
            status.code(),
            Some(0),
            "stdout:\n{stdout}\nstderr:\n{stderr}"
        );
        stdout
    }

    fn post_order(&self, customer: &str) -> (u16, String) {
        let body = format!(r#"{{"customer":"{customer}","sku":"sku-1","quantity":1}}"#);
        request(&self.addr, "POST", "/orders", &body).expect("POST /orders")
    }

    /// `GET path` as JSON (the status must be 200).
    fn json(&self, path: &str) -> serde_json::Value {
        let (status, body) = request(&self.addr, "GET", path, "").expect("GET");
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).expect("JSON")
    }

    /// Polls `GET path` until `done` holds of its JSON (at most 60 s).
    fn until(&self, path: &str, what: &str, done: impl Fn(&serde_json::Value) -> bool) {
        let start = Instant::now();
        loop {
            let (status, body) = request(&self.addr, "GET", path, "").expect("GET");
            if status == 200 && done(&serde_json::from_str(&body).expect("JSON")) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "after 60 s, {what}: {status} {body}"
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // A test that failed half-way leaves no server behind.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One HTTP/1.1 request on its own connection: the status code and the body.
fn request(addr: &str, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

fn order_id(body: &str) -> i64 {
    let value: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    value["id"].as_i64().expect("an id")
}

/// The step names of the printed report, in order.
fn report_steps(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .skip_while(|line| !line.starts_with("shutdown ("))
        .skip(2)
        .take_while(|line| !line.trim().is_empty())
        .map(|row| row.to_string())
        .collect()
}

fn position(rows: &[String], name: &str) -> usize {
    rows.iter()
        .position(|row| row.contains(name))
        .unwrap_or_else(|| panic!("{name} is not in: {rows:#?}"))
}

/// The seed's order, in the report and in what the steps printed.
fn assert_seed_order(stdout: &str) {
    let rows = report_steps(stdout);
    let steps: Vec<usize> = [
        "readiness delay",
        "http drain",
        "background",
        "critical sections",
        "kafka producer",
        "database pool",
    ]
    .iter()
    .map(|name| position(&rows, name))
    .collect();
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "{rows:#?}");
    assert!(
        rows.iter().all(|row| row.contains("completed")),
        "{rows:#?}"
    );
    // The pool closed after the relay and the consumer finished.
    let lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    let relay = position(&lines, "relay: stopped after its batch");
    let consumer = position(&lines, "consumer: stopped and left its group");
    let producer = position(&lines, "kafka producer: flushed and closed");
    let pool = position(&lines, "database pool: closed");
    assert!(
        relay < producer && consumer < producer && producer < pool,
        "{stdout}"
    );
}

/// A message read back from a topic.
#[derive(Debug)]
struct Record {
    key: String,
    payload: String,
    headers: HashMap<String, String>,
}

/// Reads `topic` (3 partitions) from the beginning until at least `at_least` messages came
/// (failing after 60 s), then for 1 s more to catch duplicates.
fn read_topic(topic: &str, at_least: usize) -> Vec<Record> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", format!("{topic}-reader"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for partition in 0..3 {
        assignment
            .add_partition_offset(topic, partition, Offset::Beginning)
            .expect("partition");
    }
    consumer.assign(&assignment).expect("assign");
    let (mut out, start) = (Vec::new(), Instant::now());
    let mut reached: Option<Instant> = None;
    while reached.is_none_or(|at| at.elapsed() < Duration::from_secs(1)) {
        assert!(
            reached.is_some() || start.elapsed() < Duration::from_secs(60),
            "{topic}: {} of at least {at_least} messages after 60 s",
            out.len()
        );
        if reached.is_none() && out.len() >= at_least {
            reached = Some(Instant::now());
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let headers = m
                    .headers()
                    .map(|all| {
                        all.iter()
                            .map(|h| {
                                let value = String::from_utf8_lossy(h.value.unwrap_or_default());
                                (h.key.to_owned(), value.into_owned())
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let text =
                    |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
                out.push(Record {
                    key: text(m.key()),
                    payload: text(m.payload()),
                    headers,
                });
            }
            Some(Err(error)) => panic!("reading {topic}: {error}"),
            None => {}
        }
    }
    out
}

/// The order ids on `order-events`, in partition order, with each event's id header.
fn order_events(names: &Names, at_least: usize) -> Vec<(String, i64, String)> {
    read_topic(&format!("{}order-events", names.prefix), at_least)
        .into_iter()
        .map(|r| {
            let value: serde_json::Value = serde_json::from_str(&r.payload).expect("JSON event");
            assert_eq!(value["event"], "order-created");
            let event_id = r
                .headers
                .get("event_id")
                .cloned()
                .expect("an event_id header");
            (
                r.key,
                value["order_id"].as_i64().expect("order_id"),
                event_id,
            )
        })
        .collect()
}

/// Asserts that the first delivery of each order comes in id order per customer (orders of
/// one customer were posted one after another), and that every id in `accepted` is there.
fn assert_all_there_in_customer_order(events: &[(String, i64, String)], accepted: &[i64]) {
    let mut first: HashSet<i64> = HashSet::new();
    let mut last: BTreeMap<&str, i64> = BTreeMap::new();
    for (customer, id, _) in events {
        if first.insert(*id)
            && let Some(previous) = last.insert(customer, *id)
        {
            assert!(previous < *id, "{customer}: order {id} after {previous}");
        }
    }
    let missing: Vec<&i64> = accepted.iter().filter(|id| !first.contains(id)).collect();
    assert!(
        missing.is_empty(),
        "orders that got 201 but never reached Kafka: {missing:?}"
    );
}

#[test]
fn orders_reach_order_events_exactly_once_with_their_event_ids_in_customer_order() {
    let names = names();
    let service = Service::start(&names, &["--delay-ms", "100", "--budget-ms", "20000"]);
    let mut accepted = Vec::new();
    for i in 0..60 {
        let (status, body) = service.post_order(&format!("c{}", i % 6));
        assert_eq!(status, 201, "{body}");
        accepted.push(order_id(&body));
    }
    let order = service.json(&format!("/orders/{}", accepted[7]));
    assert_eq!(
        (order["customer"].as_str(), order["quantity"].as_i64()),
        (Some("c1"), Some(1))
    );
    assert_eq!(
        request(&service.addr, "GET", "/orders/999999", "")
            .unwrap()
            .0,
        404
    );
    service.until("/stats", "the relay publishing all 60", |s| {
        s["relay"]["dispatched"].as_u64() >= Some(60 + 3)
    });
    let stdout = service.stop(Duration::from_secs(30));
    assert_seed_order(&stdout);

    let events = order_events(&names, 60);
    assert_eq!(events.len(), 60, "exactly once: {events:?}");
    let ids: HashSet<String> = events.iter().map(|e| e.2.clone()).collect();
    assert_eq!(ids.len(), 60, "every event has its own event id");
    assert_all_there_in_customer_order(&events, &accepted);
}

#[test]
fn sigterm_with_50_orders_in_flight_and_a_batch_open_loses_none_and_exits_0_in_order() {
    let names = names();
    // Each relay batch stays open 1.5 s after its acknowledgements.
    let args = [
        "--delay-ms",
        "300",
        "--budget-ms",
        "30000",
        "--relay-batch-ms",
        "1500",
    ];
    let service = Service::start(&names, &args);
    let addr = service.addr.clone();
    // The product events at start open the first batch.
    thread::sleep(Duration::from_millis(300));
    let in_flight: Vec<_> = (0..50)
        .map(|i| {
            let addr = addr.clone();
            thread::spawn(move || {
                let body = format!(r#"{{"customer":"c{}","sku":"sku-2","quantity":3}}"#, i % 10);
                request(&addr, "POST", "/orders", &body)
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(50));
    service.signal("TERM");
    let accepted: Vec<i64> = in_flight
        .into_iter()
        .filter_map(|order| match order.join().unwrap() {
            Ok((201, body)) => Some(order_id(&body)),
            _ => None,
        })
        .collect();
    // The wait is the hang guard (the shutdown's budget is 30 s).
    let (status, _, stdout, stderr) = service.wait(Duration::from_secs(40));
    assert_eq!(
        status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_seed_order(&stdout);
    assert!(
        !accepted.is_empty(),
        "no order was accepted before the shutdown"
    );

    // A batch was open when the relay was told to stop, and it finished.
    assert!(
        stdout.contains("(one was open at the cancel: true)"),
        "{stdout}"
    );
    // Every order that got 201 is on Kafka when the process has exited: the relay finished
    // its batch and the final drain published what the drained requests wrote.
    // (Orders of one customer were posted concurrently here: their order is the commit
    // order, which the ids need not follow, so only completeness is checked.)
    let events = order_events(&names, accepted.len());
    let published: HashSet<i64> = events.iter().map(|e| e.1).collect();
    let missing: Vec<&i64> = accepted
        .iter()
        .filter(|id| !published.contains(id))
        .collect();
    assert!(
        missing.is_empty(),
        "orders that got 201 but never reached Kafka: {missing:?}"
    );
}

#[test]
fn two_instances_on_one_database_and_broker_lose_nothing_and_keep_customer_order() {
    let names = names();
    let a = Service::start(&names, &["--delay-ms", "0"]);
    let b = Service::start(&names, &["--delay-ms", "0", "--products", "0"]);
    let mut accepted = Vec::new();
    let mut b = Some(b);
    let mut a = Some(a);
    for i in 0..100 {
        // The rolling update: the first instance goes away half-way.
        if i == 50 {
            a.take().unwrap().stop(Duration::from_secs(30));
        }
        let service = match (&a, i % 2) {
            (Some(a), 0) => a,
            _ => b.as_ref().unwrap(),
        };
        let (status, body) = service.post_order(&format!("c{}", i % 5));
        assert_eq!(status, 201, "{body}");
        accepted.push(order_id(&body));
    }
    let b = b.take().unwrap();
    let events = order_events(&names, 100);
    b.stop(Duration::from_secs(30));
    assert_all_there_in_customer_order(&events, &accepted);
    let distinct: HashSet<i64> = events.iter().map(|e| e.1).collect();
    assert_eq!(distinct.len(), 100);
}

#[test]
fn sigkill_mid_batch_then_a_restart_loses_nothing_and_product_events_apply_once() {
    let names = names();
    // Each relay batch is held open 8 s after its acknowledgements.
    let service = Service::start(&names, &["--delay-ms", "0", "--relay-batch-ms", "8000"]);
    // The product events: published (their batch then held open), consumed, applied.
    for sku in ["sku-1", "sku-2", "sku-3"] {
        service.until(&format!("/products/{sku}"), "the product applied", |p| {
            p["applied"] == 1
        });
    }
    let mut accepted = Vec::new();
    for i in 0..20 {
        let (status, body) = service.post_order(&format!("c{}", i % 4));
        assert_eq!(status, 201, "{body}");
        accepted.push(order_id(&body));
    }
    // The products' batch is still open: published, not committed.
    service.signal("KILL");
    let (status, ..) = service.wait(Duration::from_secs(10));
    assert_eq!(status.code(), None, "killed by a signal");

    let restarted = Service::start(&names, &["--delay-ms", "0", "--products", "0"]);
    let events = order_events(&names, 20);
    assert_all_there_in_customer_order(&events, &accepted);
    // The restarted relay published the products' batch again (it was never committed):
    // each product event is on the topic twice, with the same event id.
    let products = read_topic(&format!("{}product-events", names.prefix), 6);
    let mut copies: HashMap<String, usize> = HashMap::new();
    for record in &products {
        *copies
            .entry(record.headers["event_id"].clone())
            .or_default() += 1;
    }
    assert_eq!(copies.len(), 3, "{copies:?}");
    assert!(copies.values().all(|n| *n >= 2), "{copies:?}");
    // The consumer got the copies, and the inbox skipped every one.
    restarted.until("/stats", "the republished product events", |s| {
        s["inbox"]["duplicates"].as_u64() >= Some(3)
    });
    assert_eq!(restarted.json("/stats")["inbox"]["applied"], 0);
    for sku in ["sku-1", "sku-2", "sku-3"] {
        assert_eq!(
            restarted.json(&format!("/products/{sku}"))["applied"],
            1,
            "{sku}"
        );
    }
    restarted.stop(Duration::from_secs(30));
}

/// Moves the service's consumer group back to the beginning of `product-events`.
fn seek_group_back(names: &Names) {
    let topic = format!("{}product-events", names.prefix);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", &names.group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut list = TopicPartitionList::new();
    for partition in 0..3 {
        list.add_partition_offset(&topic, partition, Offset::Offset(0))
            .expect("partition");
    }
    consumer
        .commit(&list, CommitMode::Sync)
        .expect("offsets moved back");
}

#[test]
fn a_product_event_redelivered_by_a_seek_back_changes_nothing() {
    let names = names();
    let service = Service::start(&names, &["--delay-ms", "0"]);
    for sku in ["sku-1", "sku-2", "sku-3"] {
        service.until(&format!("/products/{sku}"), "the products applied", |p| {
            p["applied"] == 1
        });
    }
    service.until("/stats", "the offsets committed", |s| {
        s["consumer"]["commits"].as_u64() >= Some(1)
    });
    service.stop(Duration::from_secs(30));

    seek_group_back(&names);
    let again = Service::start(&names, &["--delay-ms", "0", "--products", "0"]);
    again.until("/stats", "the three events redelivered", |s| {
        s["inbox"]["duplicates"].as_u64() >= Some(3)
    });
    for sku in ["sku-1", "sku-2", "sku-3"] {
        let product = again.json(&format!("/products/{sku}"));
        assert_eq!(product["applied"], 1, "{sku}: {product}");
    }
    assert_eq!(again.json("/stats")["inbox"]["applied"], 0);
    again.stop(Duration::from_secs(30));
}

#[test]
fn bad_input_is_a_400_and_an_unparseable_event_goes_to_the_dead_letter_topic() {
    let names = names();
    let service = Service::start(&names, &["--delay-ms", "0", "--products", "0"]);
    for body in [
        "not json",
        r#"{"customer":"c1","sku":"s"}"#,
        r#"{"customer":"","sku":"s","quantity":1}"#,
        r#"{"customer":"c1","sku":"s","quantity":-4}"#,
    ] {
        let (status, text) = request(&service.addr, "POST", "/orders", body).unwrap();
        assert_eq!(status, 400, "{body}: {text}");
        let error: serde_json::Value = serde_json::from_str(&text).expect("a JSON error");
        assert!(
            error["error"].as_str().is_some_and(|m| !m.is_empty()),
            "{text}"
        );
    }
    // Nothing was written: the first order now gets id 1.
    let (status, body) = service.post_order("c1");
    assert_eq!(status, 201);
    assert_eq!(order_id(&body), 1);

    // A product event that does not parse, then a good one on the same key (partition).
    let topic = format!("{}product-events", names.prefix);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .expect("producer");
    for (id, payload) in [
        ("bad-1", "{not json"),
        (
            "good-1",
            r#"{"sku":"sku-9","name":"Nine","price_cents":900}"#,
        ),
    ] {
        let headers = OwnedHeaders::new().insert(Header {
            key: "event_id",
            value: Some(id),
        });
        producer
            .send(
                BaseRecord::to(&topic)
                    .key("sku-9")
                    .payload(payload)
                    .headers(headers),
            )
            .expect("queued");
    }
    producer.flush(Duration::from_secs(10)).expect("produced");
    service.until("/products/sku-9", "the good event after the bad one", |p| {
        p["applied"] == 1
    });
    assert_eq!(service.json("/stats")["consumer"]["dead_lettered"], 1);
    let letters = read_topic(&format!("{}product-events-dlq", names.prefix), 1);
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].payload, "{not json");
    assert_eq!(letters[0].key, "sku-9");
    assert!(
        letters[0].headers["dead_letter_error"].contains("not JSON"),
        "{letters:?}"
    );
    assert_eq!(letters[0].headers["event_id"], "bad-1");
    service.stop(Duration::from_secs(30));
}

#[test]
fn it_refuses_to_start_without_reachable_services_and_says_how_to_start_them() {
    let run = |vars: &[(&str, &str)]| {
        let mut command = Command::new(example_binary());
        command
            .args(["--addr", "127.0.0.1:0"])
            .env_remove("DATABASE_URL")
            .env_remove("KAFKA_BROKERS");
        for (k, v) in vars {
            command.env(k, v);
        }
        // A process that never exits fails the test with a message (not a blocked test).
        let mut child = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("runs");
        let mut stderr = child.stderr.take().expect("piped");
        let reader = thread::spawn(move || {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut stderr, &mut text).expect("stderr");
            text
        });
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if started.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!("the service neither started nor refused within 20 s: it hung");
            }
            thread::sleep(Duration::from_millis(10));
        };
        assert!(!status.success());
        reader.join().expect("stderr reader")
    };
    let unset = run(&[]);
    assert!(
        unset.contains("DATABASE_URL is not set") && unset.contains("scripts/services start"),
        "{unset}"
    );
    let database = env("DATABASE_URL");
    let no_pg = run(&[
        ("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none"),
        ("KAFKA_BROKERS", &brokers()),
    ]);
    assert!(
        no_pg.contains("cannot reach PostgreSQL at postgres://postgres@127.0.0.1:1/none"),
        "{no_pg}"
    );
    let no_kafka = run(&[
        ("DATABASE_URL", &database),
        ("KAFKA_BROKERS", "127.0.0.1:1"),
    ]);
    assert!(
        no_kafka.contains("cannot reach the Kafka broker at 127.0.0.1:1"),
        "{no_kafka}"
    );
}

#[test]
fn a_sigint_during_the_shutdown_exits_now_with_130() {
    let service = Service::start(&names(), &["--budget-ms", "10000", "--delay-ms", "5000"]);
    service.signal("TERM");
    thread::sleep(Duration::from_millis(300));
    service.signal("INT");
    // The hang guard only: the exit code and the line below show the second signal cut the
    // shutdown short (its readiness delay alone is 5 s, its budget 10 s).
    let (status, _, _, stderr) = service.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(130), "stderr:\n{stderr}");
    assert!(
        stderr.contains("SIGINT during the shutdown: exiting now with code 130"),
        "{stderr}"
    );
    assert!(stderr.contains("readiness delay"), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
}

#[test]
fn a_hanging_phase_is_cut_off_at_its_deadline_and_the_process_still_exits() {
    let args = [
        "--budget-ms",
        "4000",
        "--delay-ms",
        "200",
        "--hang-phase",
        "--json",
    ];
    let service = Service::start(&names(), &args);
    service.signal("TERM");
    // The hang guard only: the report below says the stuck phase was cut off at its deadline
    // and the rest of the shutdown ran.
    let (status, _, stdout, stderr) = service.wait(Duration::from_secs(15));
    assert_eq!(
        status.code(),
        Some(1),
        "not clean: stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let rows = report_steps(&stdout);
    let stuck = &rows[position(&rows, "stuck exporter")];
    assert!(
        stuck.contains("timed out") && stuck.contains("cut off at its deadline"),
        "{stuck}"
    );
    // The pool still closed, last.
    assert!(
        rows[position(&rows, "database pool")].contains("completed"),
        "{rows:#?}"
    );
    assert!(
        stdout.contains(r#""name":"stuck exporter","#),
        "the JSON report: {stdout}"
    );
}
