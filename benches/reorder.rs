//! Ordered parallel map: 100,000 items, 8 at a time, each call a small computation.
//! taskweave's `map_ordered` against futures' `buffered(8)` over spawned calls (ordered, the
//! peer), `buffered(8)` over plain futures (ordered, but the calls run inside the consumer's
//! task), and taskweave's unordered `fan_out` (the same work without the ordering).
//!
//! Ordered map scaling (`map_ordered_scaling/current_thread`): 65,536 items with windows of 8,
//! 1,024 and 65,536 calls at once, `map_ordered` against `buffered` over spawned calls (the
//! same window for both), on the current-thread runtime only (to keep the run short). Each call
//! yields to the scheduler 0 to 4 times, a number that depends on its item, before the same
//! small computation, so that the calls finish out of order and the results wait to be put
//! back in order. The items are fixed, so the time per item shows how the cost grows with the
//! window.
//!
//! `cargo bench -p taskweave-benches --bench reorder`; ratios in `docs/benchmarks.md`.

#[path = "common.rs"]
mod common;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use taskweave::fan::fan_out;
use taskweave::reorder::map_ordered;
use tokio_util::sync::CancellationToken;

const ITEMS: u64 = 100_000;
const CONCURRENCY: usize = 8;
const SCALING_ITEMS: u64 = 65_536;
const SCALING_WINDOWS: [usize; 3] = [8, 1_024, 65_536];

async fn work(n: u64) -> u64 {
    // A small computation, the same for everyone.
    n.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17)
}

/// `work` after yielding to the scheduler 0 to 4 times, a number that depends on the item, so
/// that the calls finish out of order.
async fn uneven_work(n: u64) -> u64 {
    for _ in 0..(n * 7919) % 5 {
        tokio::task::yield_now().await;
    }
    work(n).await
}

fn reorder_bench(c: &mut Criterion) {
    for (flavor, runtime) in common::runtimes() {
        let mut group = c.benchmark_group(format!("ordered_map_100k_x8/{flavor}"));
        group.throughput(Throughput::Elements(ITEMS));
        group.sample_size(20);
        group.measurement_time(Duration::from_secs(4));
        group.bench_function(BenchmarkId::new("taskweave_map_ordered", ITEMS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let input = futures::stream::iter(0..ITEMS);
                    let out = map_ordered(CancellationToken::new(), input, CONCURRENCY, work);
                    black_box(
                        out.fold(0_u64, |acc, r| async move { acc ^ r.unwrap() })
                            .await,
                    )
                })
            });
        });
        group.bench_function(BenchmarkId::new("buffered_spawned", ITEMS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let out = futures::stream::iter(0..ITEMS)
                        .map(|n| tokio::spawn(work(n)))
                        .buffered(CONCURRENCY);
                    black_box(
                        out.fold(0_u64, |acc, r| async move { acc ^ r.unwrap() })
                            .await,
                    )
                })
            });
        });
        group.bench_function(BenchmarkId::new("buffered_inline", ITEMS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let out = futures::stream::iter(0..ITEMS)
                        .map(work)
                        .buffered(CONCURRENCY);
                    black_box(out.fold(0_u64, |acc, r| async move { acc ^ r }).await)
                })
            });
        });
        group.bench_function(
            BenchmarkId::new("taskweave_fan_out_unordered", ITEMS),
            |b| {
                b.iter(|| {
                    runtime.block_on(async {
                        let input = futures::stream::iter(0..ITEMS);
                        let out = fan_out(CancellationToken::new(), input, CONCURRENCY, work);
                        black_box(out.fold(0_u64, |acc, r| async move { acc ^ r }).await)
                    })
                });
            },
        );
        group.finish();
    }
}

fn map_ordered_scaling(c: &mut Criterion) {
    // The current-thread runtime only, to keep the run short.
    let [(flavor, runtime), _] = common::runtimes();
    let mut group = c.benchmark_group(format!("map_ordered_scaling/{flavor}"));
    group.throughput(Throughput::Elements(SCALING_ITEMS));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(2));
    group.warm_up_time(Duration::from_millis(500));
    for window in SCALING_WINDOWS {
        group.bench_function(BenchmarkId::new("taskweave_map_ordered", window), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let input = futures::stream::iter(0..SCALING_ITEMS);
                    let out = map_ordered(CancellationToken::new(), input, window, uneven_work);
                    black_box(
                        out.fold(0_u64, |acc, r| async move { acc ^ r.unwrap() })
                            .await,
                    )
                })
            });
        });
        group.bench_function(BenchmarkId::new("buffered_spawned", window), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let out = futures::stream::iter(0..SCALING_ITEMS)
                        .map(|n| tokio::spawn(uneven_work(n)))
                        .buffered(window);
                    black_box(
                        out.fold(0_u64, |acc, r| async move { acc ^ r.unwrap() })
                            .await,
                    )
                })
            });
        });
    }
    group.finish();
}

criterion_group!(benches, reorder_bench, map_ordered_scaling);
criterion_main!(benches);
