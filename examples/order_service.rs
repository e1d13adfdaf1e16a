//! order_service: the seed's service on real components. An HTTP server writes orders to
//! PostgreSQL and their events to the outbox in the same transaction; a relay publishes
//! them to Kafka (`order-events`); a consumer applies `product-events` to a products table
//! through a transactional inbox; a periodic cleaner deletes expired orders (and inbox rows
//! older than any redelivery). SIGTERM shuts
//! it down in the seed's order, within the seed's budget, and prints the report.
//!
//! - `POST /orders` with `{"customer": "c1", "sku": "sku-1", "quantity": 2}`: the order row
//!   and its `order-created` event (key: the customer) commit together; `201` with
//!   `{"id": N}`. A malformed body is a `400` with a message, and nothing is written.
//! - `GET /orders/{id}`: the order, or `404`. `GET /products/{sku}`: a product as the
//!   consumer applied it (`applied` counts how many events changed it).
//! - `GET /stats`: the relay's, the consumer's and the inbox's counts, as JSON.
//! - `GET /readyz`: `200` until the shutdown starts, then `503`; `GET /healthz`: `200`.
//!
//! The shutdown (the seed's `readiness → cancel → srv.Shutdown → wg.Wait → producer.Close →
//! pool.Close`): readiness `503` → the readiness delay → **http drain**, while the
//! background work is told to stop → **background** (the relay finishes its batch and
//! publishes what the drained requests wrote, the consumer commits and leaves its group,
//! the cleaner stops), at most `--background-ms` → **kafka producer** flushed → **database
//! pool** closed, last. A second signal exits at once, with code 130 for SIGINT and 143 for
//! SIGTERM.
//!
//! Run it against the throwaway services `scripts/test` uses:
//!
//! ```text
//! eval "$(scripts/services start)"      # PostgreSQL on 127.0.0.1:55432, tansu on :59092
//! cargo run --example order_service -- --addr 127.0.0.1:3000
//! curl -i -X POST localhost:3000/orders -d '{"customer":"c1","sku":"sku-1","quantity":2}'
//! curl localhost:3000/orders/1
//! kill -TERM <pid>
//! ```
//!
//! Options (flags win over the environment): `--database-url` (`DATABASE_URL`),
//! `--kafka-brokers` (`KAFKA_BROKERS`), `--addr` (127.0.0.1:3000; port 0 picks one),
//! `--schema` (order_service), `--topic-prefix` (none), `--group` (the product-events
//! consumer group and inbox name: order-service-products), `--budget-ms` (60000),
//! `--delay-ms` (5000), `--http-drain-ms` (25000), `--background-ms` (20000),
//! `--order-ttl-secs` (86400), `--cleaner-ms` (60000), `--products N` (3 product events
//! published at start), `--relay-batch-ms` (0: none; a pause inside each relay batch, to
//! see a batch finish during a shutdown), `--json`, `--hang-phase`.

#[path = "support.rs"]
mod support;

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::Producer;
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgConnection, PgPool};
use taskweave::outbox::consume::{
    Consumer, ConsumerMetricsHandle, DeadLetter, HandleError, Inbox, Received, StalePolicy,
};
use taskweave::outbox::{Event, KafkaPublisher, PgStore, Relay, RelayMetricsHandle, Schema, hooks};
use taskweave::periodic::Periodic;
use taskweave_shutdown::{PhaseContext, Shutdown};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

struct Config {
    database_url: Option<String>,
    kafka_brokers: Option<String>,
    addr: String,
    schema: String,
    topic_prefix: String,
    group: String,
    budget: Duration,
    delay: Duration,
    http_drain: Duration,
    background: Duration,
    order_ttl: Duration,
    cleaner_every: Duration,
    products: u32,
    relay_batch_pause: Duration,
    json: bool,
    hang_phase: bool,
}

impl Config {
    fn from_args() -> Result<Config, String> {
        let mut config = Config {
            database_url: std::env::var("DATABASE_URL").ok().filter(|v| !v.is_empty()),
            kafka_brokers: std::env::var("KAFKA_BROKERS")
                .ok()
                .filter(|v| !v.is_empty()),
            addr: "127.0.0.1:3000".to_owned(),
            schema: "order_service".to_owned(),
            topic_prefix: String::new(),
            group: "order-service-products".to_owned(),
            budget: Duration::from_secs(60),
            delay: Duration::from_secs(5),
            http_drain: Duration::from_secs(25),
            background: Duration::from_secs(20),
            order_ttl: Duration::from_secs(86_400),
            cleaner_every: Duration::from_secs(60),
            products: 3,
            relay_batch_pause: Duration::ZERO,
            json: false,
            hang_phase: false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = || args.next().ok_or(format!("{arg} needs a value"));
            let number = |v: String| v.parse::<u64>().map_err(|e| format!("{v}: {e}"));
            match arg.as_str() {
                "--database-url" => config.database_url = Some(value()?),
                "--kafka-brokers" => config.kafka_brokers = Some(value()?),
                "--addr" => config.addr = value()?,
                "--schema" => config.schema = value()?,
                "--topic-prefix" => config.topic_prefix = value()?,
                "--group" => config.group = value()?,
                "--budget-ms" => config.budget = Duration::from_millis(number(value()?)?),
                "--delay-ms" => config.delay = Duration::from_millis(number(value()?)?),
                "--http-drain-ms" => config.http_drain = Duration::from_millis(number(value()?)?),
                "--background-ms" => config.background = Duration::from_millis(number(value()?)?),
                "--order-ttl-secs" => config.order_ttl = Duration::from_secs(number(value()?)?),
                "--cleaner-ms" => config.cleaner_every = Duration::from_millis(number(value()?)?),
                "--products" => {
                    config.products = value()?.parse().map_err(|e| format!("--products: {e}"))?;
                }
                "--relay-batch-ms" => {
                    config.relay_batch_pause = Duration::from_millis(number(value()?)?);
                }
                "--json" => config.json = true,
                "--hang-phase" => config.hang_phase = true,
                other => return Err(format!("unknown option {other}")),
            }
        }
        let plain = |s: &str| {
            !s.is_empty()
                && s.len() <= 48
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        if !plain(&config.schema) {
            return Err(format!(
                "--schema {:?}: use [a-z0-9_], at most 48 bytes",
                config.schema
            ));
        }
        if config.budget.is_zero() {
            return Err("--budget-ms must be above 0".into());
        }
        Ok(config)
    }

    fn topic(&self, name: &str) -> String {
        format!("{}{name}", self.topic_prefix)
    }
}

/// How long the inbox remembers an applied event: longer than the topic keeps it.
const INBOX_KEEP: Duration = Duration::from_secs(8 * 24 * 3600);

/// How to get the services, for the messages that need them.
const START_SERVICES: &str = "start the throwaway PostgreSQL and broker that scripts/test uses with\n  eval \"$(scripts/services start)\"\nwhich sets DATABASE_URL and KAFKA_BROKERS";

#[derive(Clone)]
struct App {
    store: PgStore,
    consumer: ConsumerMetricsHandle,
    inbox: Inbox,
    relay: RelayMetricsHandle,
    orders_table: Arc<str>,
    products_table: Arc<str>,
    order_topic: Arc<str>,
}

fn main() -> ExitCode {
    support::init_logging("info");
    let config = match Config::from_args() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("order_service: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // The very end: a stray blocking task cannot keep the process alive.
    taskweave_shutdown::block_on(runtime, Duration::from_millis(500), async move {
        match serve(config).await {
            Ok(code) => code,
            Err(error) => {
                eprintln!("order_service: {error}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Connects, checks, and creates what the service needs; a clear error when a service is
/// not there, instead of a hang.
async fn open(config: &Config) -> Result<(PgPool, KafkaPublisher, String), String> {
    let Some(url) = config.database_url.clone() else {
        return Err(format!(
            "DATABASE_URL is not set (or pass --database-url): {START_SERVICES}"
        ));
    };
    let Some(brokers) = config.kafka_brokers.clone() else {
        return Err(format!(
            "KAFKA_BROKERS is not set (or pass --kafka-brokers): {START_SERVICES}"
        ));
    };
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url)
        .await
        .map_err(|e| format!("cannot reach PostgreSQL at {url}: {e}\n{START_SERVICES}"))?;
    // The broker: its metadata within 5 s, and the topics (tansu does not create them).
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .map_err(|e| format!("KAFKA_BROKERS {brokers:?}: {e}"))?;
    let probe_brokers = brokers.clone();
    tokio::task::spawn_blocking(move || {
        let probe: rdkafka::consumer::BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &probe_brokers)
            .create()?;
        rdkafka::consumer::Consumer::fetch_metadata(&probe, None, Duration::from_secs(5))
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("cannot reach the Kafka broker at {brokers}: {e}\n{START_SERVICES}"))?;
    let topics: Vec<String> = ["order-events", "product-events", "product-events-dlq"]
        .iter()
        .map(|t| config.topic(t))
        .collect();
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, 3, TopicReplication::Fixed(1)))
        .collect();
    let created = admin
        .create_topics(
            &new,
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .map_err(|e| format!("creating the topics on {brokers}: {e}"))?;
    for result in created {
        match result {
            Ok(_) => {}
            Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, e)) => return Err(format!("creating topic {topic}: {e}")),
        }
    }
    let publisher =
        KafkaPublisher::new(&brokers).map_err(|e| format!("the Kafka producer: {e}"))?;
    Ok((pool, publisher, brokers))
}

async fn migrate(pool: &PgPool, schema: &Schema) -> Result<(), String> {
    taskweave::outbox::migrate(pool, schema, 64)
        .await
        .map_err(|e| format!("migrating the outbox: {e}"))?;
    Inbox::migrate(pool, schema)
        .await
        .map_err(|e| format!("migrating the inbox: {e}"))?;
    let s = schema.schema();
    for statement in [
        format!(
            "CREATE TABLE IF NOT EXISTS \"{s}\".orders (id bigserial PRIMARY KEY, customer text NOT NULL,
             sku text NOT NULL, quantity integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS \"{s}\".products (sku text PRIMARY KEY, name text NOT NULL,
             price_cents bigint NOT NULL, applied integer NOT NULL)"
        ),
    ] {
        sqlx::query(AssertSqlSafe(statement))
            .execute(pool)
            .await
            .map_err(|e| format!("creating the tables: {e}"))?;
    }
    Ok(())
}

async fn serve(config: Config) -> Result<ExitCode, String> {
    let (pool, publisher, brokers) = open(&config).await?;
    let schema = Schema::new(&config.schema);
    migrate(&pool, &schema).await?;
    let store = PgStore::connect(pool.clone(), schema.clone())
        .await
        .map_err(|e| format!("the outbox store: {e}"))?
        .with_notify(true);

    let root = CancellationToken::new();
    let shutdown = Shutdown::new(root, config.budget).with_readiness_delay(config.delay);
    shutdown
        .listen_for_signals()
        .map_err(|e| format!("cannot listen for signals: {e}"))?;

    // Resources, registered as they are opened; they close in reverse: the producer, then
    // the pool, last of all (the seed: closing the pool before the wait panics inside the
    // transaction).
    let closing = pool.clone();
    shutdown.resource("database pool", move |_ctx: PhaseContext| async move {
        closing.close().await;
        println!("database pool: closed");
    });
    let producer = publisher.producer();
    shutdown.resource("kafka producer", move |ctx: PhaseContext| async move {
        let flushed = tokio::task::spawn_blocking(move || producer.flush(ctx.remaining()))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        match flushed {
            Ok(()) => println!("kafka producer: flushed and closed"),
            Err(e) => println!("kafka producer: flush failed: {e}"),
        }
    });

    // The background work stops on a token of its own, cancelled when the HTTP drain
    // starts: it keeps working through the readiness delay.
    let background = CancellationToken::new();
    let order_topic = config.topic("order-events");
    let product_topic = config.topic("product-events");
    let mut relay = Relay::new(store.clone(), publisher.clone())
        .with_name("relay")
        .with_shutdown(&shutdown);
    if !config.relay_batch_pause.is_zero() {
        let pause = config.relay_batch_pause;
        relay = relay.with_hook(move |point| {
            Box::pin(async move {
                if matches!(point, hooks::Point::AfterAcks) {
                    tokio::time::sleep(pause).await;
                }
            })
        });
    }
    let relay_metrics = relay.metrics();
    let relay_task = AbortOnDropHandle::new(tokio::spawn(relay.run(background.clone())));

    let products_table: Arc<str> = format!("\"{}\".products", config.schema).into();
    let inbox = Inbox::new(pool.clone(), &schema, config.group.as_str())
        .with_stale_policy(StalePolicy::Skip);
    let table = Arc::clone(&products_table);
    let consumer = Consumer::new(&brokers, &config.group, [product_topic.as_str()])
        .with_name("products")
        // Its share of the shutdown: the background cap, counted from the cancel.
        .with_stop_budget(config.background)
        .with_dead_letter(DeadLetter::new(
            publisher.producer(),
            config.topic("product-events-dlq"),
        ))
        .start(
            background.clone(),
            inbox
                .clone()
                .handler(move |tx, message| apply_product(Arc::clone(&table), tx, message)),
        )
        .await
        .map_err(|e| format!("the product-events consumer: {e}"))?;

    let orders_table: Arc<str> = format!("\"{}\".orders", config.schema).into();
    let cleaner = Periodic::new(config.cleaner_every)
        .with_name("cleaner")
        .spawn(background.clone(), {
            let (pool, table, ttl) = (pool.clone(), Arc::clone(&orders_table), config.order_ttl);
            let inbox = inbox.clone();
            move |token| {
                let (pool, table, inbox) = (pool.clone(), Arc::clone(&table), inbox.clone());
                async move {
                    clean(pool, table, ttl, token).await;
                    // The inbox's record of applied events, past any redelivery the topic's
                    // retention (7 days by default) still allows.
                    match inbox.purge_before(INBOX_KEEP, 10_000).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(purged = n, "old inbox rows deleted"),
                        Err(e) => tracing::warn!(error = %e, "purging the inbox"),
                    }
                }
            }
        });

    // A few product events, through the outbox like any other.
    publish_products(&store, &product_topic, config.products).await?;

    let app = App {
        store: store.clone(),
        consumer: consumer.metrics_handle(),
        inbox,
        relay: relay_metrics,
        orders_table,
        products_table,
        order_topic: order_topic.into(),
    };
    let router = Router::new()
        .route("/orders", post(create_order))
        .route("/orders/{id}", get(get_order))
        .route("/products/{sku}", get(get_product))
        .route("/stats", get(stats))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", shutdown.readiness().axum_handler())
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(&config.addr)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.addr))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let stop_accepting = CancellationToken::new();
    // Aborted if its phase is cut off: the server never outlives the drain.
    let server = AbortOnDropHandle::new(tokio::spawn(
        axum::serve(listener, router)
            .with_graceful_shutdown(stop_accepting.clone().cancelled_owned())
            .into_future(),
    ));
    println!("listening on {addr} (pid {})", std::process::id());
    let _ = std::io::stdout().flush();

    // The seed's budget: HTTP drain at most 25 s, background at most 20 s, of 60 s. The
    // weights give the drain 5 / 10 of the budget and the background 4 / 5 of what is left,
    // the resources the rest; the caps hold each to the seed's numbers.
    let http_cap = config.http_drain;
    let stop_background = background.clone();
    let background_started = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let started = Arc::clone(&background_started);
    shutdown.phase_weighted("http drain", 5, move |ctx: PhaseContext| async move {
        // The seed's `cancel()`: the background work stops while the requests drain.
        *started.lock().unwrap() = Some(Instant::now());
        stop_background.cancel();
        stop_accepting.cancel();
        let until = ctx.deadline().min(Instant::now() + http_cap);
        match tokio::time::timeout_at(until, server).await {
            Ok(Ok(Ok(()))) => println!("http drain: every request answered"),
            Ok(Ok(Err(e))) => println!("http drain: server error: {e}"),
            Ok(Err(e)) => println!("http drain: server task: {e}"),
            Err(_) => ctx.abandon("requests still open at the drain's cap"),
        }
    });
    let background_cap = config.background;
    shutdown.phase_weighted("background", 4, move |ctx: PhaseContext| async move {
        let since = background_started.lock().unwrap().unwrap_or_else(Instant::now);
        let until = ctx.deadline().min(since + background_cap);
        // All three stop at once; the phase waits for the slowest (the seed's wg.Wait()).
        let relay = async {
            match tokio::time::timeout_at(until, relay_task).await {
                Ok(Ok(report)) => {
                    // What the drained requests wrote after the relay's last batch.
                    let left = Relay::new(store.clone(), publisher.clone())
                        .with_name("relay (final drain)")
                        .drain(CancellationToken::new(), until)
                        .await;
                    println!(
                        "relay: stopped after its batch (one was open at the cancel: {}), {} events published, {} more in the final drain",
                        report.finished_batch_after_cancel, report.dispatched, left.dispatched
                    );
                }
                Ok(Err(e)) => println!("relay: task failed: {e}"),
                Err(_) => ctx.abandon("relay: its batch overran the background cap"),
            }
        };
        let consumer = async {
            let report = consumer.stop(until).await;
            println!("consumer: stopped and left its group: {report}");
            for a in &report.abandoned {
                ctx.abandon(format!("consumer: {}/{}/{}", a.topic, a.partition, a.offset));
            }
            if let Err(error) = &report.final_commit {
                ctx.abandon(format!("consumer: final commit: {error}"));
            }
        };
        let cleaner = async {
            match tokio::time::timeout_at(until, cleaner).await {
                Ok(Ok(report)) => println!("cleaner: stopped after {} runs", report.runs),
                Ok(Err(e)) => println!("cleaner: {e}"),
                Err(_) => ctx.abandon("cleaner: still running at the cap"),
            }
        };
        tokio::join!(relay, consumer, cleaner);
    });
    if config.hang_phase {
        shutdown.phase("stuck exporter", |_ctx: PhaseContext| {
            std::future::pending::<()>()
        });
    }

    let report = shutdown.run().await;
    println!("{report}");
    if config.json {
        println!("{}", report.to_json());
    }
    let _ = std::io::stdout().flush();
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Enqueues `n` product events (`sku-1` …) in one transaction.
async fn publish_products(store: &PgStore, topic: &str, n: u32) -> Result<(), String> {
    if n == 0 {
        return Ok(());
    }
    let events = (1..=n)
        .map(|i| {
            let payload = json!({"sku": format!("sku-{i}"), "name": format!("Product {i}"), "price_cents": 100 * i});
            Event::new(topic, format!("sku-{i}"), payload.to_string())
        })
        .collect();
    let mut tx = store.pool().begin().await.map_err(|e| e.to_string())?;
    store
        .enqueue_batch(&mut tx, events)
        .await
        .map_err(|e| format!("enqueueing the product events: {e}"))?;
    store.commit(tx).await.map_err(|e| e.to_string())
}

/// The inbox handler of `product-events`: upserts the product on the inbox's transaction.
/// A body that does not parse is a permanent failure: it goes to the dead-letter topic.
fn apply_product<'c>(
    table: Arc<str>,
    tx: &'c mut PgConnection,
    message: &'c Received,
) -> futures::future::BoxFuture<'c, Result<(), HandleError>> {
    Box::pin(async move {
        let body: Value = serde_json::from_slice(message.payload().unwrap_or_default())
            .map_err(|e| HandleError::permanent(format!("not JSON: {e}")))?;
        let (Some(sku), Some(name), Some(price)) = (
            body["sku"].as_str(),
            body["name"].as_str(),
            body["price_cents"].as_i64(),
        ) else {
            return Err(HandleError::permanent(
                "a product needs sku, name and price_cents",
            ));
        };
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (sku, name, price_cents, applied) VALUES ($1, $2, $3, 1)
             ON CONFLICT (sku) DO UPDATE SET name = EXCLUDED.name,
             price_cents = EXCLUDED.price_cents, applied = {table}.applied + 1"
        )))
        .bind(sku)
        .bind(name)
        .bind(price)
        .execute(&mut *tx)
        .await?;
        Ok(())
    })
}

/// The cleaner's run: deletes expired orders. Not critical (the seed: interrupting it
/// loses nothing), so a cancellation interrupts it: the server cancels the statement
/// (`pg_cancel_backend`), and the connection goes back to the pool clean, instead of a
/// dropped query future leaving it mid-protocol.
async fn clean(pool: PgPool, table: Arc<str>, ttl: Duration, token: CancellationToken) {
    if token.is_cancelled() {
        return;
    }
    let result: Result<u64, sqlx::Error> = async {
        let mut conn = pool.acquire().await?;
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await?;
        let delete = sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE created_at < now() - make_interval(secs => $1)"
        )))
        .bind(ttl.as_secs_f64())
        .execute(&mut *conn);
        tokio::pin!(delete);
        // The statement first: polled before the token, it is sent before any cancel.
        tokio::select! {
            biased;
            done = &mut delete => Ok(done?.rows_affected()),
            () = token.cancelled() => {
                // A cancel that reaches the server before the statement does is lost: cancel
                // again until the statement ends (canceled: 57014) on its own connection.
                let done = loop {
                    let _ = sqlx::query("SELECT pg_cancel_backend($1)").bind(pid).execute(&pool).await;
                    tokio::select! {
                        biased;
                        done = &mut delete => break done,
                        () = tokio::time::sleep(Duration::from_millis(50)) => {}
                    }
                };
                match done {
                    Ok(done) => Ok(done.rows_affected()),
                    // 57014: canceled by the cancel above.
                    Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("57014") => {
                        println!("cleaner: its query was interrupted by the shutdown");
                        Ok(0)
                    }
                    Err(error) => Err(error),
                }
            }
        }
    }
    .await;
    match result {
        Ok(0) => {}
        Ok(n) => tracing::info!(deleted = n, "expired orders deleted"),
        Err(e) => tracing::warn!(error = %e, "deleting expired orders"),
    }
}

/// `POST /orders`: the order and its event in one transaction; 201, or 400 for a bad body.
async fn create_order(State(app): State<App>, body: String) -> (StatusCode, String) {
    let order = match parse_order(&body) {
        Ok(order) => order,
        Err(message) => {
            return (
                StatusCode::BAD_REQUEST,
                json!({"error": message}).to_string(),
            );
        }
    };
    match insert_order(&app, &order).await {
        Ok(id) => (StatusCode::CREATED, json!({"id": id}).to_string()),
        Err(e) => {
            tracing::warn!(error = %e, "writing an order");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "the order could not be stored"}).to_string(),
            )
        }
    }
}

struct NewOrder {
    customer: String,
    sku: String,
    quantity: i32,
}

fn parse_order(body: &str) -> Result<NewOrder, String> {
    let value: Value =
        serde_json::from_str(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let text = |field: &str| {
        value[field]
            .as_str()
            .filter(|s| !s.is_empty() && s.len() <= 200)
            .map(str::to_owned)
            .ok_or(format!(
                "{field} must be a non-empty string of at most 200 bytes"
            ))
    };
    let quantity = value["quantity"]
        .as_i64()
        .and_then(|q| i32::try_from(q).ok())
        .filter(|q| (1..=10_000).contains(q))
        .ok_or("quantity must be a whole number from 1 to 10000")?;
    Ok(NewOrder {
        customer: text("customer")?,
        sku: text("sku")?,
        quantity,
    })
}

async fn insert_order(app: &App, order: &NewOrder) -> Result<i64, String> {
    let mut tx = app.store.pool().begin().await.map_err(|e| e.to_string())?;
    let id: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "INSERT INTO {} (customer, sku, quantity) VALUES ($1, $2, $3) RETURNING id",
        app.orders_table
    )))
    .bind(&order.customer)
    .bind(&order.sku)
    .bind(order.quantity)
    .fetch_one(&mut *tx)
    .await
    .map_err(|e| e.to_string())?;
    let payload = json!({
        "event": "order-created", "order_id": id, "customer": order.customer,
        "sku": order.sku, "quantity": order.quantity,
    });
    app.store
        .enqueue(
            &mut tx,
            Event::new(
                &*app.order_topic,
                order.customer.as_str(),
                payload.to_string(),
            ),
        )
        .await
        .map_err(|e| e.to_string())?;
    app.store.commit(tx).await.map_err(|e| e.to_string())?;
    Ok(id)
}

/// `GET /orders/{id}`.
async fn get_order(State(app): State<App>, Path(id): Path<String>) -> (StatusCode, String) {
    let Ok(id) = id.parse::<i64>() else {
        return (
            StatusCode::BAD_REQUEST,
            json!({"error": "the id must be a number"}).to_string(),
        );
    };
    let row: Result<Option<(String, String, i32)>, _> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT customer, sku, quantity FROM {} WHERE id = $1",
        app.orders_table
    )))
    .bind(id)
    .fetch_optional(app.store.pool())
    .await;
    match row {
        Ok(Some((customer, sku, quantity))) => (
            StatusCode::OK,
            json!({"id": id, "customer": customer, "sku": sku, "quantity": quantity}).to_string(),
        ),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            json!({"error": "no such order"}).to_string(),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": e.to_string()}).to_string(),
        ),
    }
}

/// `GET /stats`: the relay's, the consumer's and the inbox's counts.
async fn stats(State(app): State<App>) -> String {
    let (relay, consumer, inbox) = (
        app.relay.snapshot(),
        app.consumer.snapshot(),
        app.inbox.stats(),
    );
    json!({
        "relay": {"dispatched": relay.dispatched, "batches": relay.batches},
        "consumer": {
            "handled": consumer.handled, "dead_lettered": consumer.dead_lettered,
            "failed_attempts": consumer.failed_attempts, "commits": consumer.commits,
        },
        "inbox": {"applied": inbox.applied, "duplicates": inbox.duplicates, "stale": inbox.stale},
    })
    .to_string()
}

/// `GET /products/{sku}`: as the consumer applied it.
async fn get_product(State(app): State<App>, Path(sku): Path<String>) -> (StatusCode, String) {
    let row: Result<Option<(String, i64, i32)>, _> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT name, price_cents, applied FROM {} WHERE sku = $1",
        app.products_table
    )))
    .bind(&sku)
    .fetch_optional(app.store.pool())
    .await;
    match row {
        Ok(Some((name, price, applied))) => (
            StatusCode::OK,
            json!({"sku": sku, "name": name, "price_cents": price, "applied": applied}).to_string(),
        ),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            json!({"error": "no such product"}).to_string(),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": e.to_string()}).to_string(),
        ),
    }
}
