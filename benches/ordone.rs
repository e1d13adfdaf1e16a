//! `or_done` against `take_until(token.cancelled())`, the usual hand-written equivalent, over
//! 100,000 ready items (the per-item cost of watching the token).
//!
//! `cargo bench -p taskweave-benches --bench ordone`; ratios in `docs/benchmarks.md`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use taskweave::ordone::OrDoneExt;
use tokio_util::sync::CancellationToken;

const ITEMS: u64 = 100_000;

fn or_done(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("ordone");
    group.throughput(Throughput::Elements(ITEMS));
    group.measurement_time(Duration::from_secs(3));
    let token = CancellationToken::new();
    group.bench_function(BenchmarkId::new("or_done", ITEMS), |b| {
        b.iter(|| {
            runtime.block_on(async {
                let stream = futures::stream::iter(0..ITEMS).or_done(token.clone());
                black_box(
                    stream
                        .fold(0_u64, |sum, item| async move { sum ^ item })
                        .await,
                )
            })
        });
    });
    group.bench_function(BenchmarkId::new("take_until", ITEMS), |b| {
        b.iter(|| {
            runtime.block_on(async {
                let stream = futures::stream::iter(0..ITEMS).take_until(token.cancelled());
                black_box(
                    stream
                        .fold(0_u64, |sum, item| async move { sum ^ item })
                        .await,
                )
            })
        });
    });
    group.bench_function(BenchmarkId::new("no_token", ITEMS), |b| {
        b.iter(|| {
            runtime.block_on(async {
                let stream = futures::stream::iter(0..ITEMS);
                black_box(
                    stream
                        .fold(0_u64, |sum, item| async move { sum ^ item })
                        .await,
                )
            })
        });
    });
    group.finish();
}

criterion_group!(benches, or_done);
criterion_main!(benches);
