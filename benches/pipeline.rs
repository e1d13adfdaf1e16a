//! Pipeline: 100k `u64` through map → filter → map, each stage on its own task with an
//! output of 32 items. taskweave's stages against the same stages written by hand with
//! async-channel and with tokio's mpsc, hand-written tasks passing `Vec` batches of 32 (the
//! cheapest version of a task per stage with hand-offs of 32 items written here), and a
//! single-task futures chain (the lower bound: no task, no channel, no concurrency between
//! the stages).
//!
//! `cargo bench -p taskweave-benches --bench pipeline`; ratios in `docs/benchmarks.md`.

#[path = "common.rs"]
mod common;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use taskweave::pipeline::{Pipeline, PipelineExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const ITEMS: u64 = 100_000;
const CAPACITY: usize = 32;

fn inc(n: u64) -> u64 {
    n + 1
}
fn keep(n: &u64) -> bool {
    !n.is_multiple_of(3)
}
fn double(n: u64) -> u64 {
    n * 2
}

async fn taskweave_stages() -> u64 {
    taskweave_stages_with(CAPACITY).await
}

/// The same with outputs of `capacity` items: what a larger hand-off batch buys.
async fn taskweave_stages_with(capacity: usize) -> u64 {
    let p = Pipeline::new(CancellationToken::new()).with_capacity(capacity);
    p.iter(0..ITEMS)
        .spawn_map(&p, |n| async move { inc(n) })
        .spawn_filter(&p, keep)
        .spawn_map(&p, |n| async move { double(n) })
        .fold(0, |sum, n| async move { sum ^ n })
        .await
}

/// map (`inc`) → filter (`keep`) → map (`double`), three spawned tasks reading `rx0` and
/// joined by bounded async-channels of `CAPACITY`; returns the last one's output. `keep` is
/// generic, so it is inlined as in a hand-written stage (not called through a pointer).
fn async_channel_map_filter_map<K>(
    rx0: async_channel::Receiver<u64>,
    keep: K,
) -> async_channel::Receiver<u64>
where
    K: Fn(&u64) -> bool + Send + 'static,
{
    let (tx1, rx1) = async_channel::bounded(CAPACITY);
    let (tx2, rx2) = async_channel::bounded(CAPACITY);
    let (tx3, rx3) = async_channel::bounded(CAPACITY);
    tokio::spawn(async move {
        while let Ok(n) = rx0.recv().await {
            if tx1.send(inc(n)).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        while let Ok(n) = rx1.recv().await {
            if keep(&n) && tx2.send(n).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        while let Ok(n) = rx2.recv().await {
            if tx3.send(double(n)).await.is_err() {
                return;
            }
        }
    });
    rx3
}

/// Four spawned tasks joined by bounded async-channels, written the way one would by hand
/// (Go's shape: each stage owns its output and stops when its input closes).
async fn async_channel_stages() -> u64 {
    let (tx0, rx0) = async_channel::bounded(CAPACITY);
    tokio::spawn(async move {
        for n in 0..ITEMS {
            if tx0.send(n).await.is_err() {
                return;
            }
        }
    });
    let rx3 = async_channel_map_filter_map(rx0, keep);
    let mut sum = 0;
    while let Ok(n) = rx3.recv().await {
        sum ^= n;
    }
    sum
}

/// The same four tasks joined by tokio's mpsc channels.
async fn mpsc_stages() -> u64 {
    let (tx0, mut rx0) = mpsc::channel(CAPACITY);
    let (tx1, mut rx1) = mpsc::channel(CAPACITY);
    let (tx2, mut rx2) = mpsc::channel(CAPACITY);
    let (tx3, mut rx3) = mpsc::channel(CAPACITY);
    tokio::spawn(async move {
        for n in 0..ITEMS {
            if tx0.send(n).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        while let Some(n) = rx0.recv().await {
            if tx1.send(inc(n)).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        while let Some(n) = rx1.recv().await {
            if keep(&n) && tx2.send(n).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        while let Some(n) = rx2.recv().await {
            if tx3.send(double(n)).await.is_err() {
                return;
            }
        }
    });
    let mut sum = 0;
    while let Some(n) = rx3.recv().await {
        sum ^= n;
    }
    sum
}

/// A reference for the shape: the same four tasks, but each hand-off is a `Vec` of up to
/// `CAPACITY` items through a tokio mpsc channel of one batch: one channel operation and at
/// most one wake-up per 32 items, no per-item room accounting, no cancellation, no panic
/// capture. Not a peer a user would write (a consumer gets its items 32 at a time, and
/// room comes back per batch, so a consumer that waits on the producer after one item can
/// stall it). The cheapest version of a task per stage with hand-offs of `CAPACITY` items
/// written here (not a proven lower bound: a `Vec` per batch, and the filter's short
/// batches are not joined).
async fn vec_batch_tasks() -> u64 {
    let (tx0, mut rx0) = mpsc::channel::<Vec<u64>>(1);
    let (tx1, mut rx1) = mpsc::channel::<Vec<u64>>(1);
    let (tx2, mut rx2) = mpsc::channel::<Vec<u64>>(1);
    let (tx3, mut rx3) = mpsc::channel::<Vec<u64>>(1);
    let batch = CAPACITY as u64;
    tokio::spawn(async move {
        let mut start = 0;
        while start < ITEMS {
            let end = (start + batch).min(ITEMS);
            if tx0.send((start..end).collect()).await.is_err() {
                return;
            }
            start = end;
        }
    });
    tokio::spawn(async move {
        while let Some(mut items) = rx0.recv().await {
            items.iter_mut().for_each(|n| *n = inc(*n));
            if tx1.send(items).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        while let Some(mut items) = rx1.recv().await {
            items.retain(keep);
            if !items.is_empty() && tx2.send(items).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        while let Some(mut items) = rx2.recv().await {
            items.iter_mut().for_each(|n| *n = double(*n));
            if tx3.send(items).await.is_err() {
                return;
            }
        }
    });
    let mut sum = 0;
    while let Some(items) = rx3.recv().await {
        sum = items.iter().fold(sum, |sum, n| sum ^ n);
    }
    sum
}

/// One task, no channel: the stages are a futures stream chain.
async fn single_task_chain() -> u64 {
    futures::stream::iter(0..ITEMS)
        .then(|n| async move { inc(n) })
        .filter(|n| futures::future::ready(keep(n)))
        .then(|n| async move { double(n) })
        .fold(0, |sum, n| async move { sum ^ n })
        .await
}

/// Latency: one item at a time. The driver sends an item into the source and waits for it
/// to come out of the third stage before sending the next, so no stage ever finds more
/// than one item waiting (nothing to batch). `ROUNDS` round trips.
const ROUNDS: u64 = 10_000;

fn keep_all(n: &u64) -> bool {
    *n != u64::MAX
}

async fn taskweave_round_trips() -> u64 {
    let (tx, rx) = async_channel::bounded(1);
    let p = Pipeline::new(CancellationToken::new()).with_capacity(CAPACITY);
    let mut out = p
        .stream(rx)
        .spawn_map(&p, |n| async move { inc(n) })
        .spawn_filter(&p, keep_all)
        .spawn_map(&p, |n| async move { double(n) });
    let mut sum = 0;
    for n in 0..ROUNDS {
        tx.send(n).await.unwrap();
        sum ^= out.next().await.unwrap();
    }
    sum
}

async fn async_channel_round_trips() -> u64 {
    let (tx, rx0) = async_channel::bounded(1);
    let rx3 = async_channel_map_filter_map(rx0, keep_all);
    let mut sum = 0;
    for n in 0..ROUNDS {
        tx.send(n).await.unwrap();
        sum ^= rx3.recv().await.unwrap();
    }
    sum
}

fn round_trips(c: &mut Criterion) {
    for (flavor, runtime) in common::runtimes() {
        let expected = runtime.block_on(async_channel_round_trips());
        let mut group = c.benchmark_group(format!("pipeline_one_at_a_time_10k/{flavor}"));
        group.throughput(Throughput::Elements(ROUNDS));
        group.sample_size(30);
        group.measurement_time(Duration::from_secs(4));
        for (name, run) in [("taskweave_stages", 0), ("async_channel_tasks", 1)] {
            let got = runtime.block_on(async {
                match run {
                    0 => taskweave_round_trips().await,
                    _ => async_channel_round_trips().await,
                }
            });
            assert_eq!(got, expected, "{name}");
            group.bench_function(BenchmarkId::new(name, ROUNDS), |b| {
                b.iter(|| {
                    runtime.block_on(async {
                        black_box(match run {
                            0 => taskweave_round_trips().await,
                            _ => async_channel_round_trips().await,
                        })
                    })
                });
            });
        }
        group.finish();
    }
}

type Boxed = std::pin::Pin<Box<dyn Future<Output = u64> + Send>>;
/// A row's name, the run it times, and whether it also runs with the consumer in a task of
/// the multi-thread runtime (`…/in_task`): spawned and joined, so the consumer runs on a
/// worker thread (like a service's request task) instead of in the future given to
/// `block_on`, on a thread of its own beside the workers.
type Row = (&'static str, fn() -> Boxed, bool);

/// The rows of `pipeline` (the runs boxed, so that one list holds them).
const ROWS: [Row; 6] = [
    ("taskweave_stages", || Box::pin(taskweave_stages()), true),
    (
        "async_channel_tasks",
        || Box::pin(async_channel_stages()),
        true,
    ),
    ("mpsc_tasks", || Box::pin(mpsc_stages()), false),
    ("single_task_chain", || Box::pin(single_task_chain()), false),
    ("vec_batch_tasks", || Box::pin(vec_batch_tasks()), true),
    (
        "taskweave_stages_capacity_1024",
        || Box::pin(taskweave_stages_with(1024)),
        true,
    ),
];

fn pipeline(c: &mut Criterion) {
    let expected = {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(single_task_chain())
    };
    for (flavor, runtime) in common::runtimes() {
        let mut group = c.benchmark_group(format!("pipeline_map_filter_map_100k/{flavor}"));
        group.throughput(Throughput::Elements(ITEMS));
        group.sample_size(30);
        group.measurement_time(Duration::from_secs(4));
        let multi_thread = flavor != "current_thread";
        let runs = ROWS
            .iter()
            .map(|&(name, run, _)| (name.to_owned(), run, false));
        let runs = runs.chain(
            ROWS.iter()
                .filter(|&&(_, _, in_task)| in_task && multi_thread)
                .map(|&(name, run, _)| (format!("{name}/in_task"), run, true)),
        );
        for (name, run, spawned) in runs {
            let go = || async move {
                if spawned {
                    common::in_task(run()).await
                } else {
                    run().await
                }
            };
            // Every implementation computes the same thing.
            let got = runtime.block_on(go());
            assert_eq!(got, expected, "{name}");
            group.bench_function(BenchmarkId::new(&name, ITEMS), |b| {
                b.iter(|| runtime.block_on(async { black_box(go().await) }));
            });
        }
        group.finish();
    }
}

criterion_group!(benches, pipeline, round_trips);
criterion_main!(benches);
