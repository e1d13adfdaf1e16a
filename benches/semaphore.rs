//! Semaphore: try_acquire, uncontended acquire/release, and 16 tasks sharing 4 permits;
//! taskweave's against tokio's, on both runtimes.
//!
//! `cargo bench -p taskweave-benches --bench semaphore`; ratios in `docs/benchmarks.md`.

#[path = "common.rs"]
mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use taskweave::semaphore::Semaphore;
use tokio_util::sync::CancellationToken;

const OPS: u64 = 10_000;
const TASKS: u64 = 16;
const PER_TASK: u64 = 1_000;

fn single(c: &mut Criterion) {
    for (flavor, runtime) in common::runtimes() {
        let mut group = c.benchmark_group(format!("semaphore_single/{flavor}"));
        group.throughput(Throughput::Elements(OPS));
        group.measurement_time(Duration::from_secs(2));
        let ours = Semaphore::new(4);
        let tokio_semaphore = tokio::sync::Semaphore::new(4);
        group.bench_function(BenchmarkId::new("try_acquire/taskweave", OPS), |b| {
            b.iter(|| {
                for _ in 0..OPS {
                    drop(black_box(ours.try_acquire().unwrap()));
                }
            });
        });
        group.bench_function(BenchmarkId::new("try_acquire/tokio", OPS), |b| {
            b.iter(|| {
                for _ in 0..OPS {
                    drop(black_box(tokio_semaphore.try_acquire().unwrap()));
                }
            });
        });
        let token = CancellationToken::new();
        group.bench_function(BenchmarkId::new("acquire_release/taskweave", OPS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    for _ in 0..OPS {
                        drop(black_box(ours.acquire(&token).await.unwrap()));
                    }
                });
            });
        });
        group.bench_function(BenchmarkId::new("acquire_release/tokio", OPS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    for _ in 0..OPS {
                        drop(black_box(tokio_semaphore.acquire().await.unwrap()));
                    }
                });
            });
        });
        group.finish();
    }
}

fn contended(c: &mut Criterion) {
    for (flavor, runtime) in common::runtimes() {
        let mut group = c.benchmark_group(format!("semaphore_16_tasks_4_permits/{flavor}"));
        group.throughput(Throughput::Elements(TASKS * PER_TASK));
        group.sample_size(30);
        group.measurement_time(Duration::from_secs(3));
        // Each task waits on a clone of one token, either a token of its own (registered on
        // for every wait) or the one the semaphore is tied to (`with_token`: nothing to
        // register, the semaphore closes when it is cancelled).
        for (name, bound) in [("taskweave", false), ("taskweave_bound_token", true)] {
            group.bench_function(BenchmarkId::new(name, TASKS * PER_TASK), |b| {
                b.iter(|| {
                    runtime.block_on(async {
                        let token = CancellationToken::new();
                        let semaphore = if bound {
                            Semaphore::new(4).with_token(token.clone())
                        } else {
                            Semaphore::new(4)
                        };
                        let tasks: Vec<_> = (0..TASKS)
                            .map(|_| {
                                let semaphore = semaphore.clone();
                                let token = token.clone();
                                tokio::spawn(async move {
                                    for _ in 0..PER_TASK {
                                        let permit = semaphore.acquire(&token).await.unwrap();
                                        tokio::task::yield_now().await;
                                        drop(permit);
                                    }
                                })
                            })
                            .collect();
                        for task in tasks {
                            task.await.unwrap();
                        }
                    });
                });
            });
        }
        // What a caller writes to make tokio's acquire cancellable.
        group.bench_function(
            BenchmarkId::new("tokio_select_token", TASKS * PER_TASK),
            |b| {
                b.iter(|| {
                    runtime.block_on(async {
                        let semaphore = Arc::new(tokio::sync::Semaphore::new(4));
                        let token = CancellationToken::new();
                        let tasks: Vec<_> = (0..TASKS)
                            .map(|_| {
                                let semaphore = Arc::clone(&semaphore);
                                let token = token.clone();
                                tokio::spawn(async move {
                                    for _ in 0..PER_TASK {
                                        let permit = tokio::select! {
                                            permit = semaphore.acquire() => permit.unwrap(),
                                            () = token.cancelled() => return,
                                        };
                                        tokio::task::yield_now().await;
                                        drop(permit);
                                    }
                                })
                            })
                            .collect();
                        for task in tasks {
                            task.await.unwrap();
                        }
                    });
                });
            },
        );
        group.bench_function(BenchmarkId::new("tokio", TASKS * PER_TASK), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let semaphore = Arc::new(tokio::sync::Semaphore::new(4));
                    let tasks: Vec<_> = (0..TASKS)
                        .map(|_| {
                            let semaphore = Arc::clone(&semaphore);
                            tokio::spawn(async move {
                                for _ in 0..PER_TASK {
                                    let permit = semaphore.acquire().await.unwrap();
                                    tokio::task::yield_now().await;
                                    drop(permit);
                                }
                            })
                        })
                        .collect();
                    for task in tasks {
                        task.await.unwrap();
                    }
                });
            });
        });
        group.finish();
    }
}

criterion_group!(benches, single, contended);
criterion_main!(benches);
