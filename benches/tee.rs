//! Tee: 100,000 items to 2 and to 4 outputs, each read by its own task. taskweave's tee
//! (lockstep, 32 items per output) against tokio's broadcast channel and a hand-written loop
//! sending every item to n async-channels of 32 (the lower bound).
//!
//! Tee scaling (`tee_scaling/current_thread`): 20,000 items to 2, 8 and 64 outputs, taskweave's
//! tee against the hand-written loop, on the current-thread runtime only (to keep the run
//! short). The items are fixed, so the time per item shows how the cost of handing each item
//! over grows with the number of outputs.
//!
//! One value at a time (`tee_one_at_a_time_10k`): 10,000 rounds, each sending one value into
//! the input and reading it from both outputs before the next, so that nothing ever waits in
//! a channel: the latency of one hand-off, where batching cannot help. taskweave's tee
//! against the hand-written loop to two async-channels.
//!
//! `cargo bench -p taskweave-benches --bench tee`; ratios in `docs/benchmarks.md`.

#[path = "common.rs"]
mod common;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use taskweave::tee::{Policy, tee, tee_with};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

const ITEMS: u64 = 100_000;
const CAPACITY: usize = 32;
const SCALING_ITEMS: u64 = 20_000;
const SCALING_OUTPUTS: [usize; 3] = [2, 8, 64];
const ROUNDS: u64 = 10_000;

/// Sums what each reader received, so that every implementation does the same work.
async fn join_readers(readers: Vec<tokio::task::JoinHandle<u64>>) -> u64 {
    let mut total = 0;
    for reader in readers {
        total += reader.await.unwrap();
    }
    total
}

async fn taskweave_tee(items: u64, n: usize) -> u64 {
    let outputs = tee_with(
        CancellationToken::new(),
        futures::stream::iter(0..items),
        vec![Policy::lockstep(CAPACITY); n],
    );
    let readers = outputs
        .into_iter()
        .map(|output| tokio::spawn(output.fold(0, |sum, v| async move { sum + v })))
        .collect();
    join_readers(readers).await
}

/// tokio's broadcast cannot hold the sender back, so it gets room for every item (with 32
/// its readers would lag and lose items).
async fn tokio_broadcast(n: usize) -> u64 {
    let (tx, _) = broadcast::channel(ITEMS as usize);
    let readers = (0..n)
        .map(|_| {
            let mut rx = tx.subscribe();
            tokio::spawn(async move {
                let mut sum = 0;
                while let Ok(v) = rx.recv().await {
                    sum += v;
                }
                sum
            })
        })
        .collect();
    tokio::spawn(async move {
        for v in 0..ITEMS {
            tx.send(v).unwrap();
        }
    });
    join_readers(readers).await
}

async fn hand_written_loop(items: u64, n: usize) -> u64 {
    let (senders, readers): (Vec<_>, Vec<_>) = (0..n)
        .map(|_| {
            let (tx, rx) = async_channel::bounded::<u64>(CAPACITY);
            let reader = tokio::spawn(async move {
                let mut sum = 0;
                while let Ok(v) = rx.recv().await {
                    sum += v;
                }
                sum
            });
            (tx, reader)
        })
        .unzip();
    tokio::spawn(async move {
        for v in 0..items {
            for tx in &senders {
                if tx.send(v).await.is_err() {
                    return;
                }
            }
        }
    });
    join_readers(readers).await
}

async fn taskweave_round_trips() -> u64 {
    let (tx, rx) = async_channel::bounded(1);
    let (mut left, mut right) = tee(CancellationToken::new(), rx);
    let mut sum = 0;
    for n in 0..ROUNDS {
        tx.send(n).await.unwrap();
        sum += left.next().await.unwrap() + right.next().await.unwrap();
    }
    sum
}

async fn hand_written_round_trips() -> u64 {
    let (tx, rx) = async_channel::bounded::<u64>(1);
    let (left_tx, left) = async_channel::bounded(CAPACITY);
    let (right_tx, right) = async_channel::bounded(CAPACITY);
    tokio::spawn(async move {
        while let Ok(v) = rx.recv().await {
            if left_tx.send(v).await.is_err() || right_tx.send(v).await.is_err() {
                return;
            }
        }
    });
    let mut sum = 0;
    for n in 0..ROUNDS {
        tx.send(n).await.unwrap();
        sum += left.recv().await.unwrap() + right.recv().await.unwrap();
    }
    sum
}

fn round_trips(c: &mut Criterion) {
    for (flavor, runtime) in common::runtimes() {
        let mut group = c.benchmark_group(format!("tee_one_at_a_time_10k/{flavor}"));
        group.throughput(Throughput::Elements(ROUNDS));
        group.sample_size(20);
        group.measurement_time(Duration::from_secs(3));
        for (name, which) in [("taskweave_tee", 0), ("hand_written_loop", 1)] {
            let run = move || async move {
                match which {
                    0 => taskweave_round_trips().await,
                    _ => hand_written_round_trips().await,
                }
            };
            assert_eq!(runtime.block_on(run()), ROUNDS * (ROUNDS - 1), "{name}");
            group.bench_function(BenchmarkId::new(name, ROUNDS), |b| {
                b.iter(|| black_box(runtime.block_on(run())));
            });
        }
        group.finish();
    }
}

fn tee_bench(c: &mut Criterion) {
    for (flavor, runtime) in common::runtimes() {
        for n in [2_usize, 4] {
            let mut group = c.benchmark_group(format!("tee_100k_to_{n}/{flavor}"));
            group.throughput(Throughput::Elements(ITEMS));
            group.sample_size(20);
            group.measurement_time(Duration::from_secs(3));
            let expected = n as u64 * (ITEMS * (ITEMS - 1) / 2);
            for (name, which) in [
                ("taskweave_tee", 0),
                ("tokio_broadcast", 1),
                ("hand_written_loop", 2),
            ] {
                let run = move || async move {
                    match which {
                        0 => taskweave_tee(ITEMS, n).await,
                        1 => tokio_broadcast(n).await,
                        _ => hand_written_loop(ITEMS, n).await,
                    }
                };
                assert_eq!(runtime.block_on(run()), expected, "{name}");
                group.bench_function(BenchmarkId::new(name, n), |b| {
                    b.iter(|| black_box(runtime.block_on(run())));
                });
            }
            group.finish();
        }
    }
}

fn tee_scaling(c: &mut Criterion) {
    // The current-thread runtime only, to keep the run short.
    let [(flavor, runtime), _] = common::runtimes();
    let mut group = c.benchmark_group(format!("tee_scaling/{flavor}"));
    group.throughput(Throughput::Elements(SCALING_ITEMS));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(2));
    group.warm_up_time(Duration::from_millis(500));
    for n in SCALING_OUTPUTS {
        let expected = n as u64 * (SCALING_ITEMS * (SCALING_ITEMS - 1) / 2);
        for (name, which) in [("taskweave_tee", 0), ("hand_written_loop", 1)] {
            let run = move || async move {
                match which {
                    0 => taskweave_tee(SCALING_ITEMS, n).await,
                    _ => hand_written_loop(SCALING_ITEMS, n).await,
                }
            };
            assert_eq!(runtime.block_on(run()), expected, "{name} to {n}");
            group.bench_function(BenchmarkId::new(name, n), |b| {
                b.iter(|| black_box(runtime.block_on(run())));
            });
        }
    }
    group.finish();
}

criterion_group!(benches, tee_bench, tee_scaling, round_trips);
criterion_main!(benches);
