//! Rate limiters: `allow()` on one bucket, and keyed `allow()` over 1,000 keys, taskweave's
//! against governor used directly (its default clock and state stores). Ours runs on its default
//! clock (the time-stamp counter, as governor's) and, for comparison, on tokio's clock
//! (`with_tokio_clock`, as in a paused-clock test).
//!
//! `cargo bench -p taskweave-benches --bench limit`; ratios in `docs/benchmarks.md`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use governor::{Quota as GovernorQuota, RateLimiter as Governor};
use taskweave::limit::{KeyedRateLimiter, Quota, RateLimiter};

const OPS: u64 = 10_000;
const KEYS: u64 = 1_000;

/// A huge rate, so that nearly every call is granted and the fast path is measured.
fn huge() -> Quota {
    Quota::per_second(1_000_000_000).with_burst(1_000_000)
}

fn allow(c: &mut Criterion) {
    let mut group = c.benchmark_group("limit_allow");
    group.throughput(Throughput::Elements(OPS));
    group.measurement_time(Duration::from_secs(2));
    // A huge rate, so that nearly every call is granted and the fast path is measured.
    let ours = RateLimiter::new(huge());
    let quota = GovernorQuota::per_second(NonZeroU32::new(1_000_000_000).unwrap())
        .allow_burst(NonZeroU32::new(1_000_000).unwrap());
    let theirs = Governor::direct(quota);
    group.bench_function(BenchmarkId::new("taskweave", OPS), |b| {
        b.iter(|| {
            for _ in 0..OPS {
                black_box(ours.allow());
            }
        });
    });
    // Forced onto tokio's clock (one system clock read per check), as in a paused-clock test.
    let tokio_clock = RateLimiter::new(huge()).with_tokio_clock();
    group.bench_function(BenchmarkId::new("taskweave_tokio_clock", OPS), |b| {
        b.iter(|| {
            for _ in 0..OPS {
                black_box(tokio_clock.allow());
            }
        });
    });
    group.bench_function(BenchmarkId::new("governor", OPS), |b| {
        b.iter(|| {
            for _ in 0..OPS {
                black_box(theirs.check().is_ok());
            }
        });
    });
    group.finish();
}

fn keyed_allow(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let mut group = c.benchmark_group("limit_keyed_allow_1000_keys");
    group.throughput(Throughput::Elements(OPS));
    group.measurement_time(Duration::from_secs(2));
    let ours = KeyedRateLimiter::builder(huge()).max_keys(10_000).build();
    let quota = GovernorQuota::per_second(NonZeroU32::new(1_000_000_000).unwrap())
        .allow_burst(NonZeroU32::new(1_000_000).unwrap());
    let theirs = Governor::keyed(quota);
    group.bench_function(BenchmarkId::new("taskweave", OPS), |b| {
        b.iter(|| {
            for i in 0..OPS {
                black_box(ours.allow(&(i % KEYS)));
            }
        });
    });
    let tokio_clock = KeyedRateLimiter::builder(huge())
        .max_keys(10_000)
        .tokio_clock()
        .build();
    group.bench_function(BenchmarkId::new("taskweave_tokio_clock", OPS), |b| {
        b.iter(|| {
            for i in 0..OPS {
                black_box(tokio_clock.allow(&(i % KEYS)));
            }
        });
    });
    group.bench_function(BenchmarkId::new("governor", OPS), |b| {
        b.iter(|| {
            for i in 0..OPS {
                black_box(theirs.check_key(&(i % KEYS)).is_ok());
            }
        });
    });
    group.finish();
}

criterion_group!(benches, allow, keyed_allow);
criterion_main!(benches);
