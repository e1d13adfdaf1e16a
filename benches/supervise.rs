//! Cost per task of a panic-capturing spawn, against `tokio::spawn` and `TaskTracker::spawn`.
//!
//! Each iteration spawns `TASKS` trivial tasks and awaits them all, so the figure covers
//! spawn, one poll, completion and join. On the multi-thread runtime the `…/in_task` rows
//! make the same spawns from a task of the runtime instead of from the thread that calls
//! `block_on`. A second group, `supervisor_scaling`, has 1, 1,000
//! and 100,000 live tasks waiting on the token, stopped together, against a `TaskTracker`:
//! how spawn and drain cost grow with the number of live tasks. Run with `cargo bench -p
//! taskweave-benches --bench supervise`; the ratios go in `docs/benchmarks.md`.

#[path = "common.rs"]
mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
                runtime.block_on(tokio_spawn_and_join());
            });
        });

        group.bench_function(BenchmarkId::new("TaskTracker::spawn", TASKS), |b| {
            b.iter(|| {
                runtime.block_on(tracker_spawn_and_wait());
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
                runtime.block_on(supervisor_spawn_and_wait());
            });
        });

        // On the multi-thread runtime, the same spawns made by a task of the runtime (as a
        // request handler makes them) instead of by the thread that calls `block_on`.
        if flavor != "current_thread" {
            for (name, run) in [
                ("tokio::spawn/in_task", tokio_spawn_and_join as fn() -> _),
                ("TaskTracker::spawn/in_task", tracker_spawn_and_wait),
                ("Supervisor::spawn/in_task", supervisor_spawn_and_wait),
            ] {
                group.bench_function(BenchmarkId::new(name, TASKS), |b| {
                    b.iter(|| runtime.block_on(common::in_task(run())));
                });
            }
        }

        // The same work as the `tokio::spawn` row: every handle kept and awaited.
        group.bench_function(BenchmarkId::new("Supervisor::spawn, joined", TASKS), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let supervisor = Supervisor::new(CancellationToken::new());
                    let handles: Vec<_> = (0..TASKS)
                        .map(|i| {
                            supervisor
                                .spawn("bench", async move { black_box(i) })
                                .unwrap()
                        })
                        .collect();
                    for handle in handles {
                        black_box(handle.await.unwrap());
                    }
                });
            });
        });

        group.finish();
    }
}

type Run = std::pin::Pin<Box<dyn Future<Output = u64> + Send>>;

/// `TASKS` spawns, every handle awaited.
fn tokio_spawn_and_join() -> Run {
    Box::pin(async {
        let handles: Vec<_> = (0..TASKS)
            .map(|i| tokio::spawn(async move { black_box(i) }))
            .collect();
        let mut sum = 0;
        for handle in handles {
            sum += black_box(handle.await.unwrap());
        }
        sum
    })
}

/// `TASKS` spawns on a tracker, closed and waited for.
fn tracker_spawn_and_wait() -> Run {
    Box::pin(async {
        let tracker = TaskTracker::new();
        for i in 0..TASKS {
            tracker.spawn(async move { black_box(i) });
        }
        tracker.close();
        tracker.wait().await;
        0
    })
}

/// `TASKS` spawns on a supervisor, handles dropped (the supervisor tracks the tasks, like
/// `TaskTracker`), closed and waited for.
fn supervisor_spawn_and_wait() -> Run {
    Box::pin(async {
        let supervisor = Supervisor::new(CancellationToken::new());
        for i in 0..TASKS {
            drop(supervisor.spawn("bench", async move { black_box(i) }));
        }
        supervisor.close();
        supervisor.wait().await;
        0
    })
}

/// Yields until `live` tasks have started (and are waiting on their token).
async fn until_all_wait(waiting: &AtomicU64, live: u64) {
    while waiting.load(Ordering::Relaxed) < live {
        tokio::task::yield_now().await;
    }
}

/// How spawn and drain cost grow with the number of live tasks: tasks that wait for the
/// token, spawned, all polled once (so each waits on the token), then stopped together (a supervisor's `shutdown`; the peer a
/// `TaskTracker` whose token is cancelled, then closed and waited for).
fn live_tasks(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("supervisor_scaling/current_thread");
    group.sample_size(10);
    group.warm_up_time(std::time::Duration::from_millis(300));
    group.measurement_time(std::time::Duration::from_secs(2));
    for live in [1_u64, 1_000, 100_000] {
        group.throughput(Throughput::Elements(live));
        group.bench_function(BenchmarkId::new("Supervisor", live), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let supervisor = Supervisor::new(CancellationToken::new());
                    let waiting = Arc::new(AtomicU64::new(0));
                    for _ in 0..live {
                        let token = supervisor.token();
                        let waiting = Arc::clone(&waiting);
                        drop(supervisor.spawn("live", async move {
                            waiting.fetch_add(1, Ordering::Relaxed);
                            token.cancelled().await;
                        }));
                    }
                    until_all_wait(&waiting, live).await;
                    let report = supervisor
                        .shutdown(std::time::Duration::from_secs(60))
                        .await;
                    black_box(report.finished.len())
                })
            });
        });
        group.bench_function(BenchmarkId::new("TaskTracker", live), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let tracker = TaskTracker::new();
                    let token = CancellationToken::new();
                    let waiting = Arc::new(AtomicU64::new(0));
                    for _ in 0..live {
                        let token = token.clone();
                        let waiting = Arc::clone(&waiting);
                        tracker.spawn(async move {
                            waiting.fetch_add(1, Ordering::Relaxed);
                            token.cancelled().await;
                        });
                    }
                    until_all_wait(&waiting, live).await;
                    token.cancel();
                    tracker.close();
                    tracker.wait().await;
                    black_box(tracker.len())
                })
            });
        });
    }
    group.finish();
}

criterion_group!(benches, spawn_and_join, live_tasks);
criterion_main!(benches);
