//! Rate limiters: `allow()` on one bucket, and keyed `allow()` over 1,000 keys, taskweave's
//! against governor used directly (its default clock and state stores). Ours runs on its default
//! clock (the time-stamp counter, as governor's) and, for comparison, on tokio's clock
//! (`with_tokio_clock`, as in a paused-clock test).
//!
//! Keyed scaling (`limit_keyed_scaling`): 100,000 keyed `allow()` calls per iteration over
//! 1,000, 100,000 and 1,000,000 distinct `u64` keys, visited in one fixed cyclic order
//! (0, 1, ..., keys - 1, 0, ...) carried on from one iteration to the next, the same for every
//! function. `taskweave` (bounded to ten times the keys, so nothing is evicted; its sweep never
//! runs, the runtime being only entered) and `governor` start with every key in their map, so
//! the time per call shows how a lookup's cost grows with the map. `taskweave_past_bound` is
//! ours bounded to a quarter of the keys: every key was evicted since its last turn, so every
//! call admits its key again, and each time a shard is full its buckets (all full again at
//! once, the quota being huge) are dropped in one scan. It has no governor counterpart:
//! governor's keyed limiter has no bound on its keys (it grows until `retain_recent` is
//! called). `taskweave_past_bound_draining` is the same with a quota of one token an hour,
//! so that no bucket is ever full again: a flood of new keys, where each full shard must
//! drop draining buckets (the closest to full) to admit one.
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
const SCALING_OPS: usize = 100_000;
const SCALING_KEYS: [usize; 3] = [1_000, 100_000, 1_000_000];

/// One token an hour in bursts of a million: every bucket used stays draining for the
/// whole run, so a full shard has no full bucket to drop and must choose among draining ones.
fn draining() -> Quota {
    Quota::every(Duration::from_secs(3600)).with_burst(1_000_000)
}

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

fn keyed_scaling(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let mut group = c.benchmark_group("limit_keyed_scaling");
    group.throughput(Throughput::Elements(SCALING_OPS as u64));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(2));
    group.warm_up_time(Duration::from_millis(500));
    let quota = GovernorQuota::per_second(NonZeroU32::new(1_000_000_000).unwrap())
        .allow_burst(NonZeroU32::new(1_000_000).unwrap());
    for keys in SCALING_KEYS {
        // Ten times the keys, as in the 1,000-key group: the hash spreads the keys unevenly
        // over the shards, and none may fill.
        let ours = KeyedRateLimiter::builder(huge())
            .max_keys(keys * 10)
            .build();
        let theirs = Governor::keyed(quota);
        let past_bound = KeyedRateLimiter::builder(huge()).max_keys(keys / 4).build();
        let past_bound_draining = KeyedRateLimiter::builder(draining())
            .max_keys(keys / 4)
            .build();
        let keys = keys as u64;
        // Every key in the map before the first call measured.
        for key in 0..keys {
            black_box(ours.allow(&key));
            black_box(theirs.check_key(&key).is_ok());
        }
        // With more keys than calls per iteration (1,000,000 against 100,000), starting again
        // at key 0 every iteration would touch only the first 100,000 keys (and never pass a
        // bound of 250,000): each function carries its place in the cycle over, across
        // iterations and samples.
        let mut order = (0..keys).cycle();
        group.bench_function(BenchmarkId::new("taskweave", keys), |b| {
            b.iter(|| {
                for key in order.by_ref().take(SCALING_OPS) {
                    black_box(ours.allow(&key));
                }
            });
        });
        let mut order = (0..keys).cycle();
        group.bench_function(BenchmarkId::new("governor", keys), |b| {
            b.iter(|| {
                for key in order.by_ref().take(SCALING_OPS) {
                    black_box(theirs.check_key(&key).is_ok());
                }
            });
        });
        let mut order = (0..keys).cycle();
        group.bench_function(BenchmarkId::new("taskweave_past_bound", keys), |b| {
            b.iter(|| {
                for key in order.by_ref().take(SCALING_OPS) {
                    black_box(past_bound.allow(&key));
                }
            });
        });
        let mut order = (0..keys).cycle();
        group.bench_function(
            BenchmarkId::new("taskweave_past_bound_draining", keys),
            |b| {
                b.iter(|| {
                    for key in order.by_ref().take(SCALING_OPS) {
                        black_box(past_bound_draining.allow(&key));
                    }
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, allow, keyed_allow, keyed_scaling);
criterion_main!(benches);
