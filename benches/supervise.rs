//! Cost per task of a panic-capturing spawn, against `tokio::spawn` and `TaskTracker::spawn`.
//!
//! Each iteration spawns `TASKS` trivial tasks and awaits them all, so the figure covers
//! spawn, one poll, completion and join. Run with `cargo bench -p taskweave-benches --bench
//! supervise`; the ratios go in `docs/benchmarks.md`.

#[path = "common.rs"]
mod common;

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use taskweave::supervise::{Supervisor, spawn};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const TASKS: u64 = 1_000;

fn spawn_and_join(c: &mut Criterion) {
    for (flavor, runtime) in common::runtimes() {
        let mut group = c.benchmark_group(format!("spawn_and_join/{flavor}"));
        group.throughput(Throughput::Elements(TASKS));

        group.bench_function(BenchmarkId::new("tokio::spawn", TASKS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let handles: Vec<_> = (0..TASKS)
                        .map(|i| tokio::spawn(async move { black_box(i) }))
                        .collect();
                    for handle in handles {
                        black_box(handle.await.unwrap());
                    }
                });
            });
        });

        group.bench_function(BenchmarkId::new("TaskTracker::spawn", TASKS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let tracker = TaskTracker::new();
                    for i in 0..TASKS {
                        tracker.spawn(async move { black_box(i) });
                    }
                    tracker.close();
                    tracker.wait().await;
                });
            });
        });

        group.bench_function(BenchmarkId::new("taskweave::spawn", TASKS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let handles: Vec<_> = (0..TASKS)
                        .map(|i| spawn("bench", async move { black_box(i) }))
                        .collect();
                    for handle in handles {
                        black_box(handle.await.unwrap());
                    }
                });
            });
        });

        group.bench_function(BenchmarkId::new("Supervisor::spawn", TASKS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let supervisor = Supervisor::new(CancellationToken::new());
                    for i in 0..TASKS {
                        // Handles dropped: the supervisor tracks the tasks, like TaskTracker.
                        drop(supervisor.spawn("bench", async move { black_box(i) }));
                    }
                    supervisor.close();
                    supervisor.wait().await;
                });
            });
        });

        group.finish();
    }
}

criterion_group!(benches, spawn_and_join);
criterion_main!(benches);
