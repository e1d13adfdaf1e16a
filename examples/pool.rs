//! Worker pools: a batch with cancellation, a long-lived pool that answers "429" when full,
//! and a close that drains (then one with a deadline that hands jobs back, and one fed from
//! a plain thread).

#[path = "support.rs"]
mod support;

use std::time::Duration;

use taskweave_pool::{JobContext, TrySubmitError, WorkerPool, run};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    support::init_logging("warn");

    // 1. A batch of 12 thumbnails on 3 workers; the operator cancels after 250 ms.
    let token = CancellationToken::new();
    let canceller = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(250)).await;
        canceller.cancel();
    });
    let report = run(token, 3, 1..=12_u32, |context: JobContext, photo| async move {
        tokio::select! {
            () = context.cancelled() => Err(format!("photo {photo}: interrupted")),
            () = tokio::time::sleep(Duration::from_millis(100)) => Ok(format!("thumb-{photo}.jpg")),
        }
    })
    .await;
    println!(
        "batch: {} results ({} errors), {} never started, cancelled: {}",
        report.results.len(),
        report.error_count(),
        report.unstarted.len(),
        report.cancelled
    );

    // 2. A long-lived pool for order processing: 2 workers, room for 3 waiting orders.
    let pool = WorkerPool::builder(2, 3).name("orders").spawn(
        CancellationToken::new(),
        |_context, order: u32| async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if order == 2 {
                return Err(format!("order {order}: card declined"));
            }
            Ok(order)
        },
    );
    for order in 1..=8 {
        match pool.try_submit(order) {
            Ok(index) => println!("order {order}: accepted as job {index}"),
            Err(TrySubmitError::Full(order)) => println!("order {order}: queue full, answer 429"),
            Err(error) => println!("order refused: {error}"),
        }
    }

    // 3. Close: no new orders, the queued ones finish.
    let report = pool.close().await;
    println!("closed: {:?}", report.metrics);

    // 4. A pool closed with a deadline: what did not start comes back.
    let pool = WorkerPool::new(
        CancellationToken::new(),
        1,
        10,
        |context: JobContext, n: u32| async move {
            tokio::select! {
                () = context.cancelled() => Err("interrupted"),
                () = tokio::time::sleep(Duration::from_millis(100)) => Ok(n),
            }
        },
    );
    for n in 0..5 {
        pool.try_submit(n).expect("room for 10");
    }
    let report = pool.close_within(Duration::from_millis(250)).await;
    let handed_back: Vec<u32> = report.handed_back.iter().map(|(_, job)| *job).collect();
    println!(
        "close_within: {} completed, {} interrupted, handed back {handed_back:?}",
        report.metrics.completed, report.interrupted
    );

    // 5. Fed from a plain thread (a blocking reader, say) through `Handle::block_on`:
    //    `resume_at` lets the full queue drain to a quarter before that thread is woken
    //    again, so it takes a core from the workers less often (docs/benchmarks.md, pool).
    let pool = WorkerPool::builder(2, 64)
        .name("checksums")
        .resume_at(16)
        .spawn(
            CancellationToken::new(),
            |_context, line: String| async move {
                Ok::<_, String>(line.bytes().map(u64::from).sum::<u64>())
            },
        );
    let runtime = tokio::runtime::Handle::current();
    let feeder = {
        let pool = pool.clone();
        std::thread::spawn(move || {
            let token = CancellationToken::new();
            for n in 0..1_000 {
                runtime
                    .block_on(pool.submit(&token, format!("line {n}")))
                    .expect("the pool is open");
            }
        })
    };
    tokio::task::spawn_blocking(move || feeder.join())
        .await
        .expect("the joining task ran")
        .expect("the feeder did not panic");
    let report = pool.close().await;
    println!(
        "fed from a thread: {} jobs completed",
        report.metrics.completed
    );
}
