//! order_service: a small HTTP service that shuts down gracefully, through
//! `taskweave-shutdown`, in the seed's order: readiness → delay → HTTP drain → worker pool
//! drain → cleaner stop → resources, and prints the report.
//!
//! - `POST /orders?work_ms=N` hands an order to a `WorkerPool` and answers `200` when it is
//!   processed, `429` when the pool's queue is full, `503` once the pool is closed.
//! - `GET /orders` counts the orders in the store; a periodic cleaner removes the processed
//!   ones older than a few seconds.
//! - `GET /readyz` is `200 ready` until the shutdown starts, then `503 not ready`;
//!   `GET /healthz` stays `200`.
//!
//! Try it by hand:
//!
//! ```text
//! cargo run --example order_service -- --delay-ms 3000
//! curl -X POST 'localhost:3000/orders?work_ms=2000' &   # in flight during the shutdown
//! kill -TERM <pid>          # or Ctrl-C: /readyz turns 503, the order still completes
//! curl localhost:3000/readyz
//! ```
//!
//! Ctrl-C twice exits at once (code 130) with the report so far.
//!
//! Options: `--addr HOST:PORT` (default 127.0.0.1:3000; port 0 picks one), `--budget-ms`
//! (10000), `--delay-ms` (2000), `--workers` (2), `--queue` (8), `--json` (also print the
//! report as JSON), `--hang-phase` (add a phase that never ends, to see it cut off).

#[path = "support.rs"]
mod support;

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use taskweave::periodic::Periodic;
use taskweave::pool::{JobContext, TrySubmitError, WorkerPool};
use taskweave_shutdown::{PhaseContext, Shutdown};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

struct Config {
    addr: String,
    budget: Duration,
    delay: Duration,
    workers: usize,
    queue: usize,
    json: bool,
    hang_phase: bool,
}

impl Config {
    fn from_args() -> Result<Config, String> {
        let mut config = Config {
            addr: "127.0.0.1:3000".to_string(),
            budget: Duration::from_secs(10),
            delay: Duration::from_secs(2),
            workers: 2,
            queue: 8,
            json: false,
            hang_phase: false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = || args.next().ok_or(format!("{arg} needs a value"));
            let millis = |v: String| {
                v.parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|e| format!("{v}: {e}"))
            };
            match arg.as_str() {
                "--addr" => config.addr = value()?,
                "--budget-ms" => config.budget = millis(value()?)?,
                "--delay-ms" => config.delay = millis(value()?)?,
                "--workers" => config.workers = value()?.parse().map_err(|e| format!("{e}"))?,
                "--queue" => config.queue = value()?.parse().map_err(|e| format!("{e}"))?,
                "--json" => config.json = true,
                "--hang-phase" => config.hang_phase = true,
                other => return Err(format!("unknown option {other}")),
            }
        }
        Ok(config)
    }
}

/// An order waiting for a worker; the HTTP handler waits on `done`.
struct Job {
    id: u64,
    work: Duration,
    done: oneshot::Sender<()>,
}

/// The orders: id → (created, processed).
type Store = Arc<Mutex<HashMap<u64, (Instant, bool)>>>;

#[derive(Clone)]
struct App {
    pool: Arc<WorkerPool<Job, (), String>>,
    store: Store,
    next_id: Arc<AtomicU64>,
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
    taskweave_shutdown::block_on(runtime, Duration::from_millis(500), serve(config))
}

async fn serve(config: Config) -> ExitCode {
    let root = CancellationToken::new();
    let shutdown = Shutdown::new(root, config.budget).with_readiness_delay(config.delay);
    if let Err(error) = shutdown.listen_for_signals() {
        eprintln!("order_service: cannot listen for signals: {error}");
        return ExitCode::FAILURE;
    }

    // Resources, registered as they are opened: they close last, in reverse order (the
    // store first, then the exporter that was opened before it).
    shutdown.resource("metrics exporter", |_ctx: PhaseContext| async move {
        println!("metrics exporter: final flush sent");
    });
    let store: Store = Arc::default();
    let closing = Arc::clone(&store);
    shutdown.resource("order store", move |_ctx: PhaseContext| async move {
        let orders = closing.lock().unwrap().len();
        println!("order store: flushed {orders} orders");
    });

    // The worker pool and the cleaner stop in their own phases, on their own tokens: the
    // root token is cancelled at the trigger, while they must keep working during the
    // readiness delay and the HTTP drain.
    let processed = Arc::clone(&store);
    let commits = shutdown.clone();
    let pool = WorkerPool::new(
        CancellationToken::new(),
        config.workers,
        config.queue,
        move |_ctx: JobContext, job: Job| {
            let (store, commits) = (Arc::clone(&processed), commits.clone());
            async move {
                tokio::time::sleep(job.work).await;
                // Recording the order is a critical section: the shutdown waits for it
                // before the store closes, and refuses new ones once it is closing.
                let Some(_commit) = commits.critical_section(format!("commit order {}", job.id))
                else {
                    return Err(format!("order {}: the store is closing", job.id));
                };
                if let Some(order) = store.lock().unwrap().get_mut(&job.id) {
                    order.1 = true;
                }
                let _ = job.done.send(());
                Ok::<(), String>(())
            }
        },
    );
    let pool = Arc::new(pool);

    let cleaner_token = CancellationToken::new();
    let cleaned = Arc::clone(&store);
    let cleaner = Periodic::new(Duration::from_secs(1))
        .with_name("cleaner")
        .spawn(cleaner_token.clone(), move |_token| {
            let store = Arc::clone(&cleaned);
            async move {
                let expired = Instant::now() - Duration::from_secs(5);
                store
                    .lock()
                    .unwrap()
                    .retain(|_, (created, done)| !*done || *created > expired);
            }
        });

    let app = App {
        pool: Arc::clone(&pool),
        store: Arc::clone(&store),
        next_id: Arc::new(AtomicU64::new(1)),
    };
    let router = Router::new()
        .route("/orders", post(create_order).get(count_orders))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", shutdown.readiness().axum_handler())
        .with_state(app);
    let listener = match tokio::net::TcpListener::bind(&config.addr).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("order_service: cannot listen on {}: {error}", config.addr);
            return ExitCode::FAILURE;
        }
    };
    let addr = listener.local_addr().expect("a bound address");
    let stop_accepting = CancellationToken::new();
    // Aborted if its phase is cut off: the server never outlives the drain.
    let server = AbortOnDropHandle::new(tokio::spawn(
        axum::serve(listener, router)
            .with_graceful_shutdown(stop_accepting.clone().cancelled_owned())
            .into_future(),
    ));
    println!("listening on {addr} (pid {})", std::process::id());
    let _ = std::io::stdout().flush();

    // The phases, in the seed's order.
    shutdown.phase("http drain", move |_ctx: PhaseContext| async move {
        // Stop accepting; in-flight requests (waiting on the pool) finish.
        stop_accepting.cancel();
        match server.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => eprintln!("http server: {error}"),
            Err(error) => eprintln!("http server task: {error}"),
        }
    });
    shutdown.phase("worker pool", move |ctx: PhaseContext| async move {
        // Drain within the phase's deadline, which leaves it time to report what it handed
        // back before it would be cut off.
        let report = pool
            .close_within(ctx.remaining().max(Duration::from_millis(1)))
            .await;
        if !report.handed_back.is_empty() {
            ctx.abandon(format!(
                "{} queued orders handed back",
                report.handed_back.len()
            ));
        }
        if report.interrupted > 0 {
            ctx.abandon(format!("{} orders interrupted", report.interrupted));
        }
    });
    shutdown.phase("cleaner", move |_ctx: PhaseContext| async move {
        cleaner_token.cancel();
        if let Ok(report) = cleaner.await {
            println!("cleaner: stopped after {} runs", report.runs);
        }
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
    if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `POST /orders?work_ms=N`: 200 once processed, 429 when the queue is full, 503 when the
/// pool is closed or handed the order back.
async fn create_order(State(app): State<App>, RawQuery(query): RawQuery) -> (StatusCode, String) {
    let work_ms = query
        .as_deref()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("work_ms=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let id = app.next_id.fetch_add(1, Ordering::Relaxed);
    let (done, processed) = oneshot::channel();
    let job = Job {
        id,
        work: Duration::from_millis(work_ms),
        done,
    };
    app.store
        .lock()
        .unwrap()
        .insert(id, (Instant::now(), false));
    match app.pool.try_submit(job) {
        Ok(_) => {}
        Err(TrySubmitError::Full(_)) => {
            app.store.lock().unwrap().remove(&id);
            return (
                StatusCode::TOO_MANY_REQUESTS,
                "queue full, retry later\n".into(),
            );
        }
        Err(_) => {
            app.store.lock().unwrap().remove(&id);
            return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n".into());
        }
    }
    match processed.await {
        Ok(()) => (StatusCode::OK, format!("order {id} processed\n")),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("order {id} not processed\n"),
        ),
    }
}

/// `GET /orders`: how many orders the store holds.
async fn count_orders(State(app): State<App>) -> String {
    format!("{}\n", app.store.lock().unwrap().len())
}
