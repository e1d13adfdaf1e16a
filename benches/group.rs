//! Task groups: cost per task of spawn-and-wait, and ordered parallel map, against tokio's
//! `JoinSet`, a `Vec` of `JoinHandle`s, `buffered(n)` and `JoinSet` + `Semaphore`.
//!
//! `cargo bench -p taskweave-benches --bench group`; ratios in `docs/benchmarks.md`.

#[path = "common.rs"]
mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use taskweave::group::{TaskGroup, map_parallel};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

const TASKS: u64 = 10_000;
const ITEMS: u64 = 10_000;
const LIMIT: usize = 8;

fn spawn_and_wait(c: &mut Criterion) {
    for (flavor, runtime) in common::runtimes() {
        let mut group = c.benchmark_group(format!("group_spawn_wait/{flavor}"));
        group.throughput(Throughput::Elements(TASKS));
        group.sample_size(30);
        group.measurement_time(Duration::from_secs(3));
        group.bench_function(BenchmarkId::new("TaskGroup", TASKS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let tasks = TaskGroup::<()>::new(CancellationToken::new());
                    for i in 0..TASKS {
                        if tasks
                            .try_spawn(async move {
                                black_box(i);
                                Ok(())
                            })
                            .is_err()
                        {
                            unreachable!("no limit");
                        }
                    }
                    tasks.wait().await.unwrap();
                });
            });
        });
        group.bench_function(BenchmarkId::new("JoinSet", TASKS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let mut set = JoinSet::new();
                    for i in 0..TASKS {
                        set.spawn(async move {
                            black_box(i);
                            Ok::<(), ()>(())
                        });
                    }
                    while let Some(done) = set.join_next().await {
                        done.unwrap().unwrap();
                    }
                });
            });
        });
        group.bench_function(BenchmarkId::new("Vec<JoinHandle>", TASKS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let handles: Vec<_> = (0..TASKS)
                        .map(|i| {
                            tokio::spawn(async move {
                                black_box(i);
                                Ok::<(), ()>(())
                            })
                        })
                        .collect();
                    for handle in handles {
                        handle.await.unwrap().unwrap();
                    }
                });
            });
        });
        group.finish();
    }
}

async fn work(n: u64) -> u64 {
    tokio::task::yield_now().await;
    black_box(n.wrapping_mul(31))
}

fn ordered_map(c: &mut Criterion) {
    for (flavor, runtime) in common::runtimes() {
        let mut group = c.benchmark_group(format!("group_ordered_map/{flavor}"));
        group.throughput(Throughput::Elements(ITEMS));
        group.sample_size(30);
        group.measurement_time(Duration::from_secs(3));
        group.bench_function(BenchmarkId::new("map_parallel", ITEMS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let out = map_parallel(
                        CancellationToken::new(),
                        0..ITEMS,
                        LIMIT,
                        |_token, n| async move { Ok::<_, ()>(work(n).await) },
                    )
                    .await
                    .unwrap();
                    black_box(out.len())
                })
            });
        });
        group.bench_function(BenchmarkId::new("buffered", ITEMS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let out: Vec<u64> = futures::stream::iter(0..ITEMS)
                        .map(work)
                        .buffered(LIMIT)
                        .collect()
                        .await;
                    black_box(out.len())
                })
            });
        });
        group.bench_function(BenchmarkId::new("JoinSet+Semaphore", ITEMS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let semaphore = Arc::new(Semaphore::new(LIMIT));
                    let mut set = JoinSet::new();
                    let mut out = vec![0_u64; ITEMS as usize];
                    for n in 0..ITEMS {
                        let permit = Arc::clone(&semaphore).acquire_owned().await.unwrap();
                        set.spawn(async move {
                            let value = work(n).await;
                            drop(permit);
                            (n, value)
                        });
                        while let Some(done) = set.try_join_next() {
                            let (n, value) = done.unwrap();
                            out[n as usize] = value;
                        }
                    }
                    while let Some(done) = set.join_next().await {
                        let (n, value) = done.unwrap();
                        out[n as usize] = value;
                    }
                    black_box(out.len())
                })
            });
        });
        group.finish();
    }
}

criterion_group!(benches, spawn_and_wait, ordered_map);
criterion_main!(benches);
