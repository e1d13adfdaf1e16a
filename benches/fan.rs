//! Fan-in: 8 producers of 12,500 items each, merged by a consumer. taskweave's `merge`
//! against `futures::stream::select_all`, `tokio_stream::StreamMap`, and all producers
//! sharing one sender (the lower bound: one channel, no merging at all).
//!
//! Fan-in scaling (`fan_in_scaling/current_thread`): 65,536 items split evenly over 2, 16, 256
//! and 4,096 producers, merged by `merge` and by `select_all`, on the current-thread runtime
//! only (to keep the run short). The total is fixed, so the time per item shows how the cost
//! of merging grows with the number of inputs.
//!
//! `cargo bench -p taskweave-benches --bench fan`; ratios in `docs/benchmarks.md`.

#[path = "common.rs"]
mod common;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use taskweave::fan::merge;
use tokio::sync::mpsc;
use tokio_stream::StreamMap;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

const PRODUCERS: u64 = 8;
const PER_PRODUCER: u64 = 12_500;
const CAPACITY: usize = 128;
/// The scaling group's total: split evenly over the inputs, whatever their number.
const SCALING_ITEMS: u64 = 65_536;
const SCALING_INPUTS: [u64; 4] = [2, 16, 256, 4_096];

/// One channel per producer (`inputs` of them), each fed by a spawned task with `per_input`
/// items.
fn producers(inputs: u64, per_input: u64) -> Vec<ReceiverStream<u64>> {
    (0..inputs)
        .map(|p| {
            let (tx, rx) = mpsc::channel(CAPACITY);
            tokio::spawn(async move {
                for i in 0..per_input {
                    if tx.send(p * per_input + i).await.is_err() {
                        return;
                    }
                }
            });
            ReceiverStream::new(rx)
        })
        .collect()
}

fn fan_in(c: &mut Criterion) {
    for (flavor, runtime) in common::runtimes() {
        let mut group = c.benchmark_group(format!("fan_in_8x12500/{flavor}"));
        group.throughput(Throughput::Elements(PRODUCERS * PER_PRODUCER));
        group.sample_size(30);
        group.measurement_time(Duration::from_secs(3));
        let total = PRODUCERS * PER_PRODUCER;
        group.bench_function(BenchmarkId::new("taskweave_merge", total), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let merged =
                        merge(CancellationToken::new(), producers(PRODUCERS, PER_PRODUCER));
                    black_box(merged.fold(0_u64, |sum, x| async move { sum ^ x }).await)
                })
            });
        });
        group.bench_function(BenchmarkId::new("select_all", total), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let merged = futures::stream::select_all(producers(PRODUCERS, PER_PRODUCER));
                    black_box(merged.fold(0_u64, |sum, x| async move { sum ^ x }).await)
                })
            });
        });
        group.bench_function(BenchmarkId::new("StreamMap", total), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let mut map = StreamMap::new();
                    let streams = producers(PRODUCERS, PER_PRODUCER);
                    for (key, stream) in streams.into_iter().enumerate() {
                        map.insert(key, stream);
                    }
                    black_box(map.fold(0_u64, |sum, (_, x)| async move { sum ^ x }).await)
                })
            });
        });
        group.bench_function(BenchmarkId::new("shared_sender", total), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let (tx, rx) = mpsc::channel(CAPACITY);
                    for p in 0..PRODUCERS {
                        let tx = tx.clone();
                        tokio::spawn(async move {
                            for i in 0..PER_PRODUCER {
                                if tx.send(p * PER_PRODUCER + i).await.is_err() {
                                    return;
                                }
                            }
                        });
                    }
                    drop(tx);
                    let stream = ReceiverStream::new(rx);
                    black_box(stream.fold(0_u64, |sum, x| async move { sum ^ x }).await)
                })
            });
        });
        group.finish();
    }
}

fn fan_in_scaling(c: &mut Criterion) {
    // The current-thread runtime only, to keep the run short.
    let [(flavor, runtime), _] = common::runtimes();
    let mut group = c.benchmark_group(format!("fan_in_scaling/{flavor}"));
    group.throughput(Throughput::Elements(SCALING_ITEMS));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(2));
    group.warm_up_time(Duration::from_millis(500));
    for inputs in SCALING_INPUTS {
        let per_input = SCALING_ITEMS / inputs;
        group.bench_function(BenchmarkId::new("taskweave_merge", inputs), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let merged = merge(CancellationToken::new(), producers(inputs, per_input));
                    black_box(merged.fold(0_u64, |sum, x| async move { sum ^ x }).await)
                })
            });
        });
        group.bench_function(BenchmarkId::new("select_all", inputs), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let merged = futures::stream::select_all(producers(inputs, per_input));
                    black_box(merged.fold(0_u64, |sum, x| async move { sum ^ x }).await)
                })
            });
        });
    }
    group.finish();
}

criterion_group!(benches, fan_in, fan_in_scaling);
criterion_main!(benches);
