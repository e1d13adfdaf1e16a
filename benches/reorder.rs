//! Ordered parallel map: 100,000 items, 8 at a time, each call a small computation.
//! taskweave's `map_ordered` against futures' `buffered(8)` over spawned calls (ordered, the
//! peer), `buffered(8)` over plain futures (ordered, but the calls run inside the consumer's
//! task), and taskweave's unordered `fan_out` (the same work without the ordering).
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

async fn work(n: u64) -> u64 {
    // A small computation, the same for everyone.
    n.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17)
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

criterion_group!(benches, reorder_bench);
criterion_main!(benches);
