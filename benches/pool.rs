//! Worker pool throughput against the ways people hand-roll one.
//!
//! Three workloads (100k trivial jobs, 10k jobs that yield once, 10k jobs of about 1 µs of
//! CPU), 4 workers, on a current-thread and a 2-worker multi-thread runtime, each with and
//! without collecting results. Implementations:
//!
//! - `WorkerPool`: ours (`submit` in a loop, then `close`; results through its stream);
//! - `async-channel`: the raw lower bound the issue names, a bounded async-channel and 4
//!   spawned workers (no panic capture, no accounting);
//! - `flume`: the same with flume, the fastest well-kept channel crate we measured;
//! - `buffer_unordered`: `stream::iter(jobs).map(handler).buffer_unordered(4)` in one task;
//! - `JoinSet+Semaphore`: a task per job, at most 4 running, joined through the `JoinSet`;
//! - `spawn_per_job`: `tokio::spawn` per job, no bound, handles awaited in order.
//!
//! Each submits from the future given to `block_on`, which on the multi-thread runtime runs
//! on a third thread beside the runtime's two. On that runtime `WorkerPool`, `async-channel`
//! and `spawn_per_job` are also measured with the submitting loop in a task of the runtime
//! (`…/in_task`), as in a service whose request handlers submit; and for the CPU jobs,
//! `parallel_cpu_work` does the jobs on two plain threads, half each (one of them spawned
//! per iteration, a few tens of µs): what two cores of this machine actually give, next to
//! the nominal ideal of half the serial time.
//!
//! A second group, `pool/cancel_blocked_submitters`, has 10,000 and 100,000 tasks blocked in
//! `submit` on a full pool cancelled at once (their requests timed out together), against the same on
//! tokio's bounded mpsc raced against the token: the cost of taking every waiter off the
//! queue's wait list.
//!
//! The `WorkerPool/submit_many`, `…/take_8` and `…/submit_many+take_8` rows feed the same pool
//! with `submit_many` of 64 jobs at a time and/or let each worker take up to 8 queued jobs at
//! once (`take_per_worker(8)`); `…/take_32` lets a worker take up to 32; `…/resume_at_32` and
//! `…/take_32+resume_at_32` let a full queue take jobs again only once drained to 32
//! (`resume_at(32)`, a quarter of the queue). The
//! `pool_scaling_workers` and `pool_scaling_queue` groups run 100,000 trivial jobs through 1,
//! 2, 8 and 64 workers and through queues of 1, 64 and 4,096, against the async-channel pool
//! of the same shape. `pool_lifecycle` times a pool's whole life with one job (built, one
//! submit, closed with `close` or `close_within`) against the hand-written async-channel pool.
//!
//! `cargo bench -p taskweave-benches --bench pool`; ratios in `docs/benchmarks.md`.

#[path = "common.rs"]
mod common;

use common::in_task;

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use taskweave::pool::WorkerPool;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

const WORKERS: usize = 4;
const CAPACITY: usize = 128;

#[derive(Clone, Copy, Debug)]
enum Workload {
    Trivial,
    YieldOnce,
    Cpu,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Trivial => "trivial",
            Workload::YieldOnce => "yield_once",
            Workload::Cpu => "cpu_1us",
        }
    }

    fn jobs(self) -> u64 {
        match self {
            Workload::Trivial => 100_000,
            Workload::YieldOnce | Workload::Cpu => 10_000,
        }
    }
}

/// About 1 µs of arithmetic on the bench machine (see `docs/benchmarks.md`).
fn cpu_work(seed: u64) -> u64 {
    let mut value = seed;
    for _ in 0..CPU_ROUNDS {
        value = black_box(
            value
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1),
        );
    }
    value
}

const CPU_ROUNDS: u32 = 700;

async fn job(workload: Workload, input: u64) -> u64 {
    match workload {
        Workload::Trivial => black_box(input),
        Workload::YieldOnce => {
            tokio::task::yield_now().await;
            black_box(input)
        }
        Workload::Cpu => cpu_work(input),
    }
}

/// How the `WorkerPool` rows feed the pool: one `submit` per job, or `submit_many` of
/// [`BATCH`] jobs at a time; how many jobs a worker takes at once (`take_per_worker`); and
/// whether a full queue resumes only once drained to [`RESUME_AT`] (`resume_at`).
#[derive(Clone, Copy, Debug)]
struct Feed {
    batch: bool,
    take: usize,
    resume: bool,
}

const ONE_BY_ONE: Feed = Feed {
    batch: false,
    take: 1,
    resume: false,
};

/// The `submit_many` size of the batched rows, and their `take_per_worker`.
const BATCH: u64 = 64;
const TAKE: usize = 8;
/// A longer take: with a queue of 128 and four workers a worker's share of a full queue is
/// 128 / 4 = 32, this cap, so a blocked submitter can be woken once per up to 32 freed
/// slots instead of 8.
const TAKE_LONG: usize = 32;
/// `resume_at` of the `…/resume_at_32` rows: a quarter of the queue.
const RESUME_AT: usize = CAPACITY / 4;

/// The batched variants, with their row names.
const FEEDS: [(&str, Feed); 6] = [
    (
        "WorkerPool/submit_many",
        Feed {
            batch: true,
            take: 1,
            resume: false,
        },
    ),
    (
        "WorkerPool/take_8",
        Feed {
            batch: false,
            take: TAKE,
            resume: false,
        },
    ),
    (
        "WorkerPool/submit_many+take_8",
        Feed {
            batch: true,
            take: TAKE,
            resume: false,
        },
    ),
    (
        "WorkerPool/take_32",
        Feed {
            batch: false,
            take: TAKE_LONG,
            resume: false,
        },
    ),
    (
        "WorkerPool/resume_at_32",
        Feed {
            batch: false,
            take: 1,
            resume: true,
        },
    ),
    (
        "WorkerPool/take_32+resume_at_32",
        Feed {
            batch: false,
            take: TAKE_LONG,
            resume: true,
        },
    ),
];

async fn worker_pool(workload: Workload, results: bool) -> u64 {
    fed_worker_pool(workload, results, ONE_BY_ONE).await
}

/// A pool's size: its workers and its queue's capacity.
#[derive(Clone, Copy, Debug)]
struct Shape {
    workers: usize,
    capacity: usize,
}

const SHAPE: Shape = Shape {
    workers: WORKERS,
    capacity: CAPACITY,
};

async fn fed_worker_pool(workload: Workload, results: bool, feed: Feed) -> u64 {
    shaped_worker_pool(workload, results, feed, SHAPE).await
}

async fn shaped_worker_pool(workload: Workload, results: bool, feed: Feed, shape: Shape) -> u64 {
    let token = CancellationToken::new();
    let builder = WorkerPool::builder(shape.workers, shape.capacity).take_per_worker(feed.take);
    let builder = if results {
        builder.results(shape.capacity)
    } else {
        builder
    };
    let builder = if feed.resume {
        builder.resume_at(RESUME_AT.min(shape.capacity - 1))
    } else {
        builder
    };
    let pool = builder.spawn(token.clone(), move |_token, input: u64| async move {
        Ok::<_, std::convert::Infallible>(job(workload, input).await)
    });
    let produce = async {
        if feed.batch {
            let mut start = 0;
            while start < workload.jobs() {
                let end = (start + BATCH).min(workload.jobs());
                if pool.submit_many(&token, start..end).await.is_err() {
                    unreachable!("the pool is open");
                }
                start = end;
            }
        } else {
            for input in 0..workload.jobs() {
                if pool.submit(&token, input).await.is_err() {
                    unreachable!("the pool is open");
                }
            }
        }
        pool.close().await;
    };
    if results {
        let mut stream = pool.results().expect("enabled");
        // The same loop as the hand-written pool's consumer (`fold` would add a future per
        // item to our side only).
        let consume = async move {
            let mut sum = 0_u64;
            while let Some((_, outcome)) = stream.next().await {
                sum = sum.wrapping_add(outcome.unwrap_or_default());
            }
            sum
        };
        tokio::join!(produce, consume).1
    } else {
        produce.await;
        0
    }
}

/// What the hand-written pools need of a channel: they differ in nothing else.
trait Channel {
    type Sender: Clone + Send + Sync + 'static;
    type Receiver: Clone + Send + Sync + 'static;
    fn bounded(capacity: usize) -> (Self::Sender, Self::Receiver);
    fn send(sender: &Self::Sender, value: u64) -> impl Future<Output = bool> + Send;
    fn recv(receiver: &Self::Receiver) -> impl Future<Output = Option<u64>> + Send;
}

struct AsyncChannel;

impl Channel for AsyncChannel {
    type Sender = async_channel::Sender<u64>;
    type Receiver = async_channel::Receiver<u64>;
    fn bounded(capacity: usize) -> (Self::Sender, Self::Receiver) {
        async_channel::bounded(capacity)
    }
    async fn send(sender: &Self::Sender, value: u64) -> bool {
        sender.send(value).await.is_ok()
    }
    async fn recv(receiver: &Self::Receiver) -> Option<u64> {
        receiver.recv().await.ok()
    }
}

struct Flume;

impl Channel for Flume {
    type Sender = flume::Sender<u64>;
    type Receiver = flume::Receiver<u64>;
    fn bounded(capacity: usize) -> (Self::Sender, Self::Receiver) {
        flume::bounded(capacity)
    }
    async fn send(sender: &Self::Sender, value: u64) -> bool {
        sender.send_async(value).await.is_ok()
    }
    async fn recv(receiver: &Self::Receiver) -> Option<u64> {
        receiver.recv_async().await.ok()
    }
}

/// The hand-written pool: one bounded job channel, `WORKERS` spawned workers, one bounded
/// results channel; a channel closes when its last sender is dropped.
async fn channel_pool<C: Channel>(workload: Workload, results: bool) -> u64 {
    shaped_channel_pool::<C>(workload, results, SHAPE).await
}

async fn shaped_channel_pool<C: Channel>(workload: Workload, results: bool, shape: Shape) -> u64 {
    let (job_tx, job_rx) = C::bounded(shape.capacity);
    let (result_tx, result_rx) = C::bounded(shape.capacity);
    let mut workers = Vec::with_capacity(shape.workers);
    for _ in 0..shape.workers {
        let job_rx = job_rx.clone();
        let result_tx = result_tx.clone();
        workers.push(tokio::spawn(async move {
            while let Some(input) = C::recv(&job_rx).await {
                let output = job(workload, input).await;
                if results {
                    let _ = C::send(&result_tx, output).await;
                }
            }
        }));
    }
    drop(result_tx);
    let produce = async {
        for input in 0..workload.jobs() {
            assert!(C::send(&job_tx, input).await, "the workers are alive");
        }
        drop(job_tx);
        for worker in workers {
            worker.await.unwrap();
        }
    };
    let consume = async {
        let mut sum = 0_u64;
        while let Some(output) = C::recv(&result_rx).await {
            sum = sum.wrapping_add(output);
        }
        sum
    };
    tokio::join!(produce, consume).1
}

async fn buffer_unordered(workload: Workload, results: bool) -> u64 {
    let outputs = futures::stream::iter(0..workload.jobs())
        .map(|input| job(workload, input))
        .buffer_unordered(WORKERS);
    if results {
        outputs
            .fold(0_u64, |sum, output| async move { sum.wrapping_add(output) })
            .await
    } else {
        outputs
            .for_each(|output| async move {
                black_box(output);
            })
            .await;
        0
    }
}

async fn join_set_semaphore(workload: Workload, results: bool) -> u64 {
    let semaphore = Arc::new(Semaphore::new(WORKERS));
    let mut set = JoinSet::new();
    let mut sum = 0_u64;
    for input in 0..workload.jobs() {
        let permit = Arc::clone(&semaphore).acquire_owned().await.unwrap();
        set.spawn(async move {
            let output = job(workload, input).await;
            drop(permit);
            output
        });
        // Reap finished tasks as we go, so the set does not grow to every job.
        while let Some(done) = set.try_join_next() {
            let output = done.unwrap();
            if results {
                sum = sum.wrapping_add(output);
            }
        }
    }
    while let Some(done) = set.join_next().await {
        let output = done.unwrap();
        if results {
            sum = sum.wrapping_add(output);
        }
    }
    sum
}

async fn spawn_per_job(workload: Workload, results: bool) -> u64 {
    let handles: Vec<_> = (0..workload.jobs())
        .map(|input| tokio::spawn(job(workload, input)))
        .collect();
    let mut sum = 0_u64;
    for handle in handles {
        let output = handle.await.unwrap();
        if results {
            sum = sum.wrapping_add(output);
        }
    }
    sum
}

/// The CPU jobs on two plain threads, half each: the real two-core floor of this machine.
fn parallel_cpu_work(jobs: u64) -> u64 {
    let half = jobs / 2;
    std::thread::scope(|scope| {
        let first = scope.spawn(|| (0..half).fold(0_u64, |sum, input| sum ^ cpu_work(input)));
        let second = (half..jobs).fold(0_u64, |sum, input| sum ^ cpu_work(input));
        first.join().expect("cpu_work does not panic") ^ second
    })
}

fn pool(c: &mut Criterion) {
    for (flavor, runtime) in common::runtimes() {
        for workload in [Workload::Trivial, Workload::YieldOnce, Workload::Cpu] {
            for results in [false, true] {
                let mode = if results { "results" } else { "no_results" };
                let mut group =
                    c.benchmark_group(format!("pool/{}/{mode}/{flavor}", workload.name()));
                group.throughput(Throughput::Elements(workload.jobs()));
                group.sample_size(20);
                group.warm_up_time(Duration::from_millis(500));
                group.measurement_time(Duration::from_secs(2));
                let jobs = workload.jobs();
                group.bench_function(BenchmarkId::new("WorkerPool", jobs), |b| {
                    b.iter(|| runtime.block_on(worker_pool(workload, results)));
                });
                for (name, feed) in FEEDS {
                    group.bench_function(BenchmarkId::new(name, jobs), |b| {
                        b.iter(|| runtime.block_on(fed_worker_pool(workload, results, feed)));
                    });
                }
                group.bench_function(BenchmarkId::new("async-channel", jobs), |b| {
                    b.iter(|| runtime.block_on(channel_pool::<AsyncChannel>(workload, results)));
                });
                group.bench_function(BenchmarkId::new("flume", jobs), |b| {
                    b.iter(|| runtime.block_on(channel_pool::<Flume>(workload, results)));
                });
                group.bench_function(BenchmarkId::new("buffer_unordered", jobs), |b| {
                    b.iter(|| runtime.block_on(buffer_unordered(workload, results)));
                });
                group.bench_function(BenchmarkId::new("JoinSet+Semaphore", jobs), |b| {
                    b.iter(|| runtime.block_on(join_set_semaphore(workload, results)));
                });
                group.bench_function(BenchmarkId::new("spawn_per_job", jobs), |b| {
                    b.iter(|| runtime.block_on(spawn_per_job(workload, results)));
                });
                if flavor == "multi_thread_2" {
                    group.bench_function(BenchmarkId::new("WorkerPool/in_task", jobs), |b| {
                        b.iter(|| runtime.block_on(in_task(worker_pool(workload, results))));
                    });
                    for (name, feed) in FEEDS {
                        let name = format!("{name}/in_task");
                        group.bench_function(BenchmarkId::new(name, jobs), |b| {
                            b.iter(|| {
                                runtime.block_on(in_task(fed_worker_pool(workload, results, feed)))
                            });
                        });
                    }
                    group.bench_function(BenchmarkId::new("async-channel/in_task", jobs), |b| {
                        b.iter(|| {
                            runtime
                                .block_on(in_task(channel_pool::<AsyncChannel>(workload, results)))
                        });
                    });
                    group.bench_function(BenchmarkId::new("spawn_per_job/in_task", jobs), |b| {
                        b.iter(|| runtime.block_on(in_task(spawn_per_job(workload, results))));
                    });
                }
                if matches!(workload, Workload::Cpu) && !results {
                    // The ideal for CPU work on 2 cores is half of this serial figure.
                    group.bench_function(BenchmarkId::new("serial_cpu_work", jobs), |b| {
                        b.iter(|| (0..jobs).fold(0_u64, |sum, input| sum ^ cpu_work(input)));
                    });
                    if flavor == "multi_thread_2" {
                        group.bench_function(BenchmarkId::new("parallel_cpu_work", jobs), |b| {
                            b.iter(|| parallel_cpu_work(jobs));
                        });
                    }
                }
                group.finish();
            }
        }
    }
}

/// How many submitters wait on a full queue when their requests are cancelled together.
const BLOCKED: [u64; 2] = [10_000, 100_000];

/// A pool whose one worker holds its job until the pool is cancelled and whose one queue slot
/// is taken: every later `submit` waits.
async fn full_pool(parent: &CancellationToken) -> WorkerPool<u64, (), String> {
    let pool = WorkerPool::new(parent.clone(), 1, 1, |context, _job: u64| async move {
        context.cancelled().await;
        Ok(())
    });
    pool.try_submit(0).unwrap();
    tokio::task::yield_now().await; // the worker takes job 0
    pool.try_submit(1).unwrap();
    pool
}

/// One token per request, as a service gives each request its own deadline.
fn request_tokens(blocked: u64) -> Vec<CancellationToken> {
    (0..blocked).map(|_| CancellationToken::new()).collect()
}

/// Cancels the requests in one fixed shuffled order (requests with different deadlines
/// time out in no particular order relative to their arrival in the queue).
fn cancel_shuffled(requests: &[CancellationToken]) {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    fastrand::Rng::with_seed(7).shuffle(&mut order);
    for at in order {
        requests[at].cancel();
    }
}

/// Waits until every spawned submitter has run up to its wait: each counts itself in
/// `started` in the poll that registers it as a waiter. (A few `yield_now`s are not enough:
/// the current-thread runtime polls about 61 tasks between two polls of `block_on`'s future,
/// and a submitter first polled after the cancellation never waits at all.)
async fn settle(started: &AtomicU64, blocked: u64) {
    while started.load(Ordering::Relaxed) < blocked {
        tokio::task::yield_now().await;
    }
    // The last ones counted themselves just before their first wait: let them reach it.
    tokio::task::yield_now().await;
}

/// `BLOCKED` tasks wait in `submit` on a full pool, each with its request's token; the
/// requests are then cancelled together, in a shuffled order (an overloaded service timing
/// out a wave of requests). The time from the first cancellation to the last task's end.
async fn cancel_blocked_worker_pool(blocked: u64) -> Duration {
    let parent = CancellationToken::new();
    let pool = full_pool(&parent).await;
    let elapsed = time_cancelled_wave(blocked, |job, request| {
        let pool = pool.clone();
        async move { pool.submit(&request, job).await.is_err() }
    })
    .await;
    parent.cancel();
    drop(pool.close().await);
    elapsed
}

/// The same with tokio's bounded mpsc (its waiters are an intrusive list: O(1) removal), each
/// send raced against the request's token.
async fn cancel_blocked_tokio_mpsc(blocked: u64) -> Duration {
    let (sender, mut receiver) = tokio::sync::mpsc::channel::<u64>(1);
    sender.send(0).await.unwrap();
    let elapsed = time_cancelled_wave(blocked, |job, request| {
        let sender = sender.clone();
        async move {
            tokio::select! {
                biased;
                () = request.cancelled() => true,
                sent = sender.send(job) => sent.is_err(),
            }
        }
    })
    .await;
    receiver.close();
    elapsed
}

/// Spawns `blocked` tasks, each running `submit(job, its request token)` (which must block),
/// waits until all of them wait, cancels the requests in a shuffled order, and times the
/// cancellations up to the last task's end. Each task must answer `true` (refused).
async fn time_cancelled_wave<F, Fut>(blocked: u64, submit: F) -> Duration
where
    F: Fn(u64, CancellationToken) -> Fut,
    Fut: Future<Output = bool> + Send + 'static,
{
    let requests = request_tokens(blocked);
    let started = Arc::new(AtomicU64::new(0));
    let mut submitters = JoinSet::new();
    for (job, request) in (0..blocked).zip(&requests) {
        let (wait, started) = (submit(job, request.clone()), Arc::clone(&started));
        submitters.spawn(async move {
            // Counted in the poll that reaches the wait (see `settle`).
            started.fetch_add(1, Ordering::Relaxed);
            wait.await
        });
    }
    settle(&started, blocked).await;
    let clock = std::time::Instant::now();
    cancel_shuffled(&requests);
    let mut refused = 0;
    while let Some(joined) = submitters.join_next().await {
        refused += u64::from(joined.unwrap());
    }
    let elapsed = clock.elapsed();
    assert_eq!(refused, blocked);
    elapsed
}

/// The sum of `iters` timed runs of `run`: `iter_custom`'s answer.
fn summed<Fut: Future<Output = Duration>>(
    runtime: &tokio::runtime::Runtime,
    iters: u64,
    run: impl Fn() -> Fut,
) -> Duration {
    runtime.block_on(async {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            total += run().await;
        }
        total
    })
}

fn cancel_blocked(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("pool/cancel_blocked_submitters/current_thread");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    for blocked in BLOCKED {
        group.throughput(Throughput::Elements(blocked));
        group.bench_function(BenchmarkId::new("WorkerPool", blocked), |b| {
            b.iter_custom(|iters| summed(&runtime, iters, || cancel_blocked_worker_pool(blocked)));
        });
        group.bench_function(BenchmarkId::new("tokio-mpsc+select", blocked), |b| {
            b.iter_custom(|iters| summed(&runtime, iters, || cancel_blocked_tokio_mpsc(blocked)));
        });
    }
    group.finish();
}

/// How the cost per job grows with the pool's size: 100,000 trivial jobs through pools of
/// 1, 2, 8 and 64 workers (queue 128), and through queues of 1, 64 and 4,096 (4 workers),
/// against the hand-written async-channel pool of the same shape.
fn scaling(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let jobs = Workload::Trivial.jobs();
    let workers = [1, 2, 8, 64].map(|workers| Shape {
        workers,
        capacity: CAPACITY,
    });
    let queues = [1, 64, 4096].map(|capacity| Shape {
        workers: WORKERS,
        capacity,
    });
    for (name, shapes) in [("workers", &workers[..]), ("queue", &queues[..])] {
        let mut group = c.benchmark_group(format!("pool_scaling_{name}/current_thread"));
        group.throughput(Throughput::Elements(jobs));
        group.sample_size(10);
        group.warm_up_time(Duration::from_millis(300));
        group.measurement_time(Duration::from_secs(1));
        for &shape in shapes {
            let parameter = if name == "workers" {
                shape.workers
            } else {
                shape.capacity
            };
            group.bench_function(BenchmarkId::new("WorkerPool", parameter), |b| {
                b.iter(|| {
                    runtime.block_on(shaped_worker_pool(
                        Workload::Trivial,
                        false,
                        ONE_BY_ONE,
                        shape,
                    ))
                });
            });
            group.bench_function(BenchmarkId::new("async-channel", parameter), |b| {
                b.iter(|| {
                    runtime.block_on(shaped_channel_pool::<AsyncChannel>(
                        Workload::Trivial,
                        false,
                        shape,
                    ))
                });
            });
        }
        group.finish();
    }
}

/// A pool's whole life with one trivial job: built (4 workers, queue 128), one job
/// submitted, closed and waited for: `close`, `close_within` (a deadline of a minute that is
/// never reached) and the hand-written async-channel pool of the same shape (the sender
/// dropped, the workers joined). For code that makes a short-lived pool per request.
fn lifecycle(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("pool_lifecycle/current_thread");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(2));
    let pool = || {
        WorkerPool::new(
            CancellationToken::new(),
            WORKERS,
            CAPACITY,
            |_context, input: u64| async move { Ok::<_, std::convert::Infallible>(input) },
        )
    };
    group.bench_function("WorkerPool/close", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let pool = pool();
                pool.try_submit(1).unwrap();
                black_box(pool.close().await.metrics.completed)
            })
        });
    });
    group.bench_function("WorkerPool/close_within", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let pool = pool();
                pool.try_submit(1).unwrap();
                let report = pool.close_within(Duration::from_secs(60)).await;
                black_box(report.metrics.completed)
            })
        });
    });
    group.bench_function("async-channel", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let (sender, receiver) = async_channel::bounded::<u64>(CAPACITY);
                let workers: Vec<_> = (0..WORKERS)
                    .map(|_| {
                        let receiver = receiver.clone();
                        tokio::spawn(async move {
                            let mut done = 0_u64;
                            while let Ok(input) = receiver.recv().await {
                                done += black_box(input);
                            }
                            done
                        })
                    })
                    .collect();
                sender.try_send(1).unwrap();
                drop(sender);
                let mut completed = 0;
                for worker in workers {
                    completed += worker.await.unwrap();
                }
                black_box(completed)
            })
        });
    });
    group.finish();
}

criterion_group!(benches, pool, cancel_blocked, scaling, lifecycle);
criterion_main!(benches);
