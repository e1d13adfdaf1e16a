//! The tour: every taskweave pattern end to end, printing what happens. Ends on its own in
//! about two seconds. `RUST_LOG=warn cargo run --example tour` also shows the `tracing` events
//! (panics with their backtraces, failed runs).

#[path = "support.rs"]
mod support;

use std::time::Duration;

use futures::StreamExt;
use taskweave::fan::{fan_out, merge};
use taskweave::group::{CollectGroup, TaskGroup, map_parallel};
use taskweave::limit::{KeyedRateLimiter, Quota, RateLimiter};
use taskweave::ordone::OrDoneExt;
use taskweave::outbox::{Event, MemoryPublisher, MemoryStore, PublishError, Relay};
use taskweave::periodic::{FirstRun, Periodic};
use taskweave::pipeline::{Pipeline, PipelineExt, StageEnd};
use taskweave::pool::{JobContext, TrySubmitError, WorkerPool, run};
use taskweave::reorder::map_ordered;
use taskweave::semaphore::Semaphore;
use taskweave::supervise::{RestartPolicy, Supervisor, spawn};
use taskweave::tee::{Policy, tee_with};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    support::init_logging("off");
    let root = CancellationToken::new();
    supervise(&root).await;
    periodic(&root).await;
    pool(&root).await;
    group(&root).await;
    limits(&root).await;
    streams(&root).await;
    pipeline(&root).await;
    tee_and_reorder(&root).await;
    outbox(&root).await;
    println!("\n== shutdown ==");
    println!("graceful shutdown needs real signals: try `eval \"$(scripts/services start)\"`,");
    println!("then `cargo run --example order_service -- --relay-batch-ms 2000`, post an order");
    println!(
        "(curl -X POST localhost:3000/orders -d '{{\"customer\":\"c1\",\"sku\":\"sku-1\",\"quantity\":1}}'),"
    );
    println!("then Ctrl-C: the relay's batch finishes first (a second Ctrl-C exits at once)");
    println!("\ntour finished");
}

async fn supervise(root: &CancellationToken) {
    println!("== supervise: panics are captured, work is drained by deadline ==");

    // The seed's safeGo: a panicking task does not take the process down, and the other
    // tasks keep running.
    let heartbeat_token = root.child_token();
    let heartbeat = {
        let token = heartbeat_token.clone();
        spawn("heartbeat", async move {
            let mut beats = 0_u32;
            while !token.is_cancelled() {
                tokio::time::sleep(Duration::from_millis(10)).await;
                beats += 1;
            }
            beats
        })
    };
    let error = spawn("worker", async { panic!("boom") }).await.unwrap_err();
    let panic = error.into_panic().expect("it panicked");
    println!(
        "task {} panicked: {} (at {}, backtrace captured: {})",
        panic.name(),
        panic.message(),
        panic.location().unwrap_or("?"),
        panic.backtrace().status() == std::backtrace::BacktraceStatus::Captured
    );
    println!("main is still running");
    tokio::time::sleep(Duration::from_millis(50)).await;
    heartbeat_token.cancel();
    let beats = heartbeat.await.expect("the heartbeat never panics");
    println!(
        "heartbeat kept beating through the panic: {} beats",
        beats.min(5)
    );

    // The seed's drain: 50 ms of work within a 100 ms budget …
    let supervisor = Supervisor::new(root.clone());
    supervisor
        .spawn("quick", tokio::time::sleep(Duration::from_millis(50)))
        .expect("open");
    println!("{}", supervisor.shutdown(Duration::from_millis(100)).await);
    let accepted = supervisor.spawn("late", async {}).is_ok();
    println!("accepted after close: {accepted}");

    // … and 2 s of work that outlives the budget: aborted and named.
    let supervisor = Supervisor::new(root.clone());
    supervisor
        .spawn("slow", tokio::time::sleep(Duration::from_secs(2)))
        .expect("open");
    println!("{}", supervisor.shutdown(Duration::from_millis(100)).await);

    // A long-lived task that fails twice, restarted with backoff.
    let supervisor = Supervisor::new(root.clone());
    let mut attempts = 0;
    let flaky = supervisor
        .spawn_restarting(
            "flaky-consumer",
            RestartPolicy::new(5, Duration::from_secs(10))
                .with_backoff(Duration::from_millis(20), Duration::from_millis(200)),
            move |_token| {
                attempts += 1;
                let attempt = attempts;
                async move {
                    if attempt < 3 {
                        Err(format!("broker unavailable (attempt {attempt})"))
                    } else {
                        Ok(())
                    }
                }
            },
        )
        .expect("open");
    let outcome = flaky.await.expect("no panic");
    println!(
        "flaky-consumer: {:?} after {} restarts",
        outcome.map_err(|error| error.to_string()),
        supervisor.metrics().restarts
    );

    // Past its intensity limit a task escalates: the supervisor cancels its own token.
    let supervisor = Supervisor::new(root.clone());
    let doomed = supervisor
        .spawn_restarting(
            "doomed",
            RestartPolicy::new(2, Duration::from_secs(10))
                .with_backoff(Duration::from_millis(10), Duration::from_millis(10)),
            |_token| async { Err("database unreachable") },
        )
        .expect("open");
    let error = doomed.await.expect("no panic").unwrap_err();
    println!("{error}");
    println!(
        "supervisor token cancelled: {}, root token cancelled: {}",
        supervisor.token().is_cancelled(),
        root.is_cancelled()
    );
}

async fn periodic(root: &CancellationToken) {
    println!("\n== periodic: no bursts, no overlap, bounded runs, isolated failures ==");
    let token = root.child_token();
    let started = Instant::now();
    let mut run = 0;
    let runner = Periodic::new(Duration::from_millis(100))
        .with_name("cleaner")
        .with_first_run(FirstRun::Immediately)
        .with_timeout(Duration::from_millis(150))
        .spawn(token.clone(), move |_run_token| {
            run += 1;
            let this_run = run;
            println!(
                "  run {this_run} starts at {:>3} ms",
                started.elapsed().as_millis()
            );
            async move {
                match this_run {
                    2 => Err("expired orders table locked".to_owned()),
                    3 => panic!("corrupt order row"),
                    4 => {
                        // Hangs: the 150 ms timeout cuts it short, and the tick it overran
                        // (400 ms) is skipped, not replayed in a burst.
                        tokio::time::sleep(Duration::from_secs(10)).await;
                        Ok(())
                    }
                    _ => Ok(()),
                }
            }
        });
    tokio::time::sleep(Duration::from_millis(750)).await;
    token.cancel();
    let report = runner.await.expect("the runner itself never panics");
    println!("cleaner: {report}");
}

async fn pool(root: &CancellationToken) {
    println!("\n== pool: bounded concurrency, every result back, nothing lost on stop ==");

    // The batch runner: 10 jobs on 3 workers, one fails and one panics; cancelled at 150 ms.
    let token = root.child_token();
    let canceller = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        canceller.cancel();
    });
    let report = run(token, 3, 0..10_u32, |context: JobContext, n| async move {
        tokio::time::sleep(Duration::from_millis(60)).await;
        match n {
            2 => Err(format!("job {n}: upstream said 500")),
            4 => panic!("job {n}: malformed input"),
            _ if context.is_cancelled() => Err(format!("job {n}: cancelled")),
            _ => Ok(n * n),
        }
    })
    .await;
    for (index, outcome) in &report.results {
        match outcome {
            Ok(square) => println!("  job {index}: ok {square}"),
            Err(error) => println!("  job {index}: {error}"),
        }
    }
    let unstarted: Vec<usize> = report.unstarted.iter().map(|(index, _)| *index).collect();
    println!(
        "batch cancelled: {}, never started: {unstarted:?}",
        report.cancelled
    );

    // A long-lived pool: 1 worker, room for 2 waiting jobs; the rest get "429".
    let pool = WorkerPool::new(
        root.child_token(),
        1,
        2,
        |_context, order: u32| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, String>(order)
        },
    );
    let mut answers = Vec::new();
    for order in 1..=5 {
        answers.push(match pool.try_submit(order) {
            Ok(_) => "202",
            Err(TrySubmitError::Full(_)) => "429",
            Err(TrySubmitError::Closed(_)) => "503",
            Err(_) => "500",
        });
    }
    println!("answers to 5 orders: {answers:?}");
    let report = pool.close().await;
    println!(
        "pool closed: {} completed, {} rejected, {} handed back",
        report.metrics.completed, report.metrics.rejected, report.metrics.handed_back
    );
}

async fn group(root: &CancellationToken) {
    println!("\n== group: the first failure cancels the rest; or collect every failure ==");
    let page = TaskGroup::new(root.clone());
    for (source, ms, fails) in [
        ("profile", 10_u64, false),
        ("orders", 20, true),
        ("ads", 1_000, false),
    ] {
        let token = page.token();
        page.spawn(async move {
            tokio::select! {
                () = token.cancelled() => Err(format!("{source}: cancelled")),
                () = tokio::time::sleep(Duration::from_millis(ms)) => {
                    if fails { Err(format!("{source}: 503")) } else { Ok(()) }
                }
            }
        })
        .await
        .expect("no limit");
    }
    let started = Instant::now();
    let outcome = page.wait().await.map_err(|failure| failure.to_string());
    println!(
        "page: {outcome:?} after {} ms (the 1 s source was cancelled, its error did not win)",
        started.elapsed().as_millis()
    );

    let mut notify = CollectGroup::new(root.clone()).with_limit(2);
    for user in 1..=5_u32 {
        notify
            .spawn(user, async move {
                if user == 2 || user == 4 {
                    Err("mailbox full")
                } else {
                    Ok(())
                }
            })
            .await
            .expect("not cancelled");
    }
    let report = notify.wait().await;
    let failed: Vec<u32> = report.failures.iter().map(|(user, _)| *user).collect();
    println!("notified {} users, failed: {failed:?}", report.succeeded);

    let squares = map_parallel(root.clone(), 1..=6_u64, 3, |_token, n| async move {
        tokio::time::sleep(Duration::from_millis(30 - n * 4)).await;
        Ok::<_, String>(n * n)
    })
    .await
    .expect("no failure");
    println!("map_parallel keeps input order: {squares:?}");
}

async fn limits(root: &CancellationToken) {
    println!("\n== semaphore and limit: how many at once, how many per second ==");
    // Tied to the application's token: it closes at shutdown, and waits on `root` itself
    // register nothing on the token.
    let api = Semaphore::new(2).with_token(root.clone());
    let first = api.acquire(root).await.expect("open");
    let second = api.acquire(root).await.expect("open");
    println!("in use {} of {}", api.in_use(), api.capacity());
    let impatient = root.child_token();
    let canceller = impatient.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        canceller.cancel();
    });
    println!(
        "a third caller with a 20 ms deadline: {:?}",
        api.acquire(&impatient).await.map(|_| ())
    );
    println!(
        "asking for 3 of 2: {:?}",
        api.acquire_many(root, 3).await.map(|_| ())
    );
    drop((first, second));

    let limiter = RateLimiter::new(Quota::per_second(20).with_burst(2));
    let started = Instant::now();
    for n in 1..=4 {
        limiter.wait(root).await.expect("not cancelled");
        println!("  token {n} at {:>3} ms", started.elapsed().as_millis());
    }
    let per_client = KeyedRateLimiter::builder(Quota::per_second(1))
        .max_keys(1_000)
        .token(root.child_token())
        .build();
    let answers: Vec<&str> = ["alice", "alice", "bob"]
        .iter()
        .map(|client| {
            if per_client.allow(client) {
                "200"
            } else {
                "429"
            }
        })
        .collect();
    println!("alice, alice, bob: {answers:?}");
}

async fn streams(root: &CancellationToken) {
    println!("\n== ordone and fan: streams that stop on a token, fair merges, fan-out ==");
    let token = root.child_token();
    let mut ticks = futures::stream::iter(1..).or_done(token.clone());
    let mut seen = Vec::new();
    while let Some(tick) = ticks.next().await {
        seen.push(tick);
        if tick == 3 {
            token.cancel();
        }
    }
    println!("or_done stopped the endless stream after {seen:?}, no select! needed");

    let busy = futures::stream::iter(vec!["busy"; 4]);
    let quiet = futures::stream::iter(vec!["quiet"; 2]);
    let merged: Vec<&str> = merge(root.clone(), [busy, quiet]).collect().await;
    println!("merge takes turns: {merged:?}");

    let mut squares: Vec<u64> = fan_out(
        root.clone(),
        futures::stream::iter(1..=6_u64),
        3,
        |n| async move {
            tokio::time::sleep(Duration::from_millis(10 * (7 - n))).await;
            n * n
        },
    )
    .collect()
    .await;
    print!("fan_out over 3 copies, completion order {squares:?}");
    squares.sort_unstable();
    println!(", sorted {squares:?}");
}

async fn pipeline(root: &CancellationToken) {
    println!("\n== pipeline: stages on their own tasks, stopped by one token ==");
    let token = root.child_token();
    let p = Pipeline::new(token.clone());
    let mut odd_squares = p
        .iter(1..=5_u64)
        .spawn_map(&p.named("square"), |n| async move { n * n })
        .spawn_filter(&p.named("odd"), |n| n % 2 == 1);
    let mut seen = Vec::new();
    while let Some(v) = odd_squares.next().await {
        seen.push(v);
        if v > 8 {
            token.cancel();
            break;
        }
    }
    println!("odd squares of 1..=5, cancelled after a value > 8: {seen:?}");

    let p = Pipeline::new(root.clone());
    let results: Vec<Result<u32, String>> = p
        .iter(["10", "x", "30"])
        .spawn_map(&p.named("parse"), |s: &str| async move {
            s.parse::<u32>().map_err(|_| format!("not a number: {s:?}"))
        })
        .spawn_try_map(&p.named("halve"), |n| async move { Ok(n / 2) })
        .collect()
        .await;
    println!("try_map passes the error through in its place: {results:?}");

    let mut out = p
        .iter(1..=3_u32)
        .spawn_map(&p.named("divide"), |n| async move { 10 / (2 - n) });
    let got: Vec<u32> = (&mut out).collect().await;
    if let Some(StageEnd::Panicked(panic)) = out.end() {
        println!(
            "a panicking stage ends the output early ({got:?}) and says so: {:?} panicked: {}",
            panic.name(),
            panic.message()
        );
    }
}

async fn tee_and_reorder(root: &CancellationToken) {
    println!("\n== tee and reorder: one stream to several consumers, results back in order ==");
    let mut outputs = tee_with(
        root.clone(),
        futures::stream::iter(1..=10_u32),
        [Policy::lockstep(2), Policy::drop_oldest(3)],
    );
    let live = outputs.pop().unwrap();
    let archive = outputs.pop().unwrap();
    let archived: Vec<u32> = archive.collect().await;
    println!("the lockstep output got everything: {archived:?}");
    let lagged = live.lagged();
    let newest: Vec<u32> = live.collect().await;
    println!(
        "the drop-oldest output, read late, kept the newest {newest:?} and counted {lagged} dropped"
    );

    let out: Vec<String> = map_ordered(
        root.clone(),
        futures::stream::iter(1..=6_u64),
        3,
        |n| async move {
            tokio::time::sleep(Duration::from_millis(60 - 10 * n)).await; // later ones finish first
            assert!(n != 4, "item {n} failed");
            n * n
        },
    )
    .map(|result| match result {
        Ok(square) => square.to_string(),
        Err(panic) => format!("<{}>", panic.message()),
    })
    .collect()
    .await;
    println!("map_ordered, 3 at a time, later items finishing first: {out:?}");
}

async fn outbox(root: &CancellationToken) {
    println!(
        "\n== outbox: events commit with the business data, relays publish them in key order =="
    );
    println!(
        "(in memory here; the same relay runs on PostgreSQL and Kafka: see docs/patterns/outbox.md)"
    );
    let store = MemoryStore::new(64);
    let publisher = MemoryPublisher::new();
    // The broker refuses one key for now: only that key waits, the others flow.
    publisher.fail_when(|record| {
        (record.key == b"order-2").then(|| PublishError::retriable("broker unavailable"))
    });
    let token = root.child_token();
    let relays: Vec<_> = ["relay-a", "relay-b"]
        .into_iter()
        .map(|name| {
            let relay = Relay::new(store.clone(), publisher.clone())
                .with_name(name)
                .with_buckets_per_batch(4)
                .with_poll_interval(Duration::from_millis(20));
            tokio::spawn(relay.run(token.clone()))
        })
        .collect();

    for order in 1..=3 {
        let mut tx = store.begin();
        for status in ["created", "paid"] {
            tx.enqueue(Event::new(
                "order-events",
                format!("order-{order}"),
                status.as_bytes().to_vec(),
            ))
            .expect("a valid event");
        }
        tx.commit();
    }
    let mut rolled_back = store.begin();
    rolled_back
        .enqueue(Event::new("order-events", "order-4", b"created".to_vec()))
        .expect("a valid event");
    drop(rolled_back); // the business transaction failed: its event is gone with it

    tokio::time::sleep(Duration::from_millis(50)).await;
    println!(
        "published while order-2's broker partition is down: {:?} ({} pending)",
        published(&publisher),
        store.pending()
    );
    publisher.heal();
    tokio::time::sleep(Duration::from_millis(50)).await;
    println!("after it heals: {:?}", published(&publisher));
    token.cancel();
    for relay in relays {
        println!("{}", relay.await.expect("the relay task"));
    }
}

fn published(publisher: &MemoryPublisher) -> Vec<String> {
    publisher
        .published()
        .iter()
        .map(|p| {
            format!(
                "{} {} (seq {})",
                String::from_utf8_lossy(&p.key),
                String::from_utf8_lossy(&p.payload),
                p.sequence
            )
        })
        .collect()
}
