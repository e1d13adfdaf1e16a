//! `KeyedRateLimiter`: one token bucket per key, with a bound on the number of keys.

mod builder;
mod reservation;
mod sweep;

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::HashTable;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::gcra::{Clock, Rate};
use crate::{CheckError, KeyedWait, Quota};
use taskweave_supervise::internal::lock;

pub use builder::KeyedRateLimiterBuilder;
pub use reservation::KeyedReservation;

const SHARDS: usize = 16;

/// The default bound on keys: 100,000.
pub const DEFAULT_MAX_KEYS: usize = 100_000;

/// A token bucket per key (a client, an IP address, a tenant), with memory that stays bounded
/// however many distinct keys pass through.
///
/// - At most `max_keys` buckets exist. A bucket that is full again (its key idle for long
///   enough) is the same as no bucket, so forgetting it loses nothing: the limiter's own
///   sweep (a task started at the first use inside a tokio runtime, stopped by the builder's
///   token or when the last handle is dropped) removes those every `sweep_every` (by default
///   the time to refill a whole burst). Building one needs no runtime.
/// - When a new key arrives and its shard is full, full buckets are removed first; if that
///   frees less than a sixteenth of the shard, the draining buckets closest to full are
///   dropped until a sixteenth is free, and their keys start again with a full burst. The
///   bound therefore wins over the limit: with more keys active at once than a shard holds
///   (`max_keys` spread over up to 16 shards), the evicted keys are not limited, and a
///   client cycling through many keys can exploit that. Size `max_keys` above the number of
///   keys you expect to be active within one refill time. (governor's keyed limiter grows
///   until someone calls `retain_recent`.) Admitting a new key into a full shard scans that
///   shard (two passes and a selection) and frees room for the next sixteenth of its
///   capacity, so a flood of new keys pays one scan per sixteenth of a shard admitted, not
///   one per key (shards of fewer than 32, a bound under 512, free one slot per scan; their
///   scans are short). The price: one new key can reset up to a sixteenth of a shard's
///   draining keys at once (about 390 at the default bound), not one; if the flood stops
///   there, those keys lost their state for nothing.
/// - Per key, the calls of [`RateLimiter`](crate::RateLimiter) with the same meaning:
///   [`allow`](Self::allow), [`allow_n`](Self::allow_n), [`check_n`](Self::check_n),
///   [`wait`](Self::wait), [`wait_n`](Self::wait_n), [`reserve_n`](Self::reserve_n) (with
///   [`KeyedReservation::cancel`]).
/// - The clock: the time-stamp counter unless built with
///   [`tokio_clock`](KeyedRateLimiterBuilder::tokio_clock), as for
///   [`RateLimiter`](crate::RateLimiter).
///
/// # Examples
///
/// ```
/// use taskweave_limit::{KeyedRateLimiter, Quota};
///
/// let per_client = KeyedRateLimiter::builder(Quota::per_second(5).with_burst(2))
///     .max_keys(10_000)
///     .build();
/// assert!(per_client.allow(&"alice"));
/// assert!(per_client.allow(&"alice"));
/// assert!(!per_client.allow(&"alice"));
/// assert!(per_client.allow(&"bob")); // every key has its own bucket
/// assert_eq!(per_client.len(), 2);
/// ```
pub struct KeyedRateLimiter<K> {
    inner: Arc<Inner<K>>,
}

/// One key's state: its theoretical arrival time (see `gcra/mod.rs`), and when its latest
/// reservation is due.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tat: u64,
    last_due: u64,
    /// Unique per bucket made: a reservation of an evicted bucket does not refund into the
    /// one made for the same key later.
    born: u64,
}

struct Inner<K> {
    clock: Clock,
    rate: Rate,
    shard_capacity: usize,
    hasher: RandomState,
    shards: Box<[Mutex<Shard<K>>]>,
    sweep_every: Duration,
    /// The sweep's token: a child of the builder's, cancelled when the last handle drops.
    sweep_token: CancellationToken,
    sweep_started: AtomicBool,
    buckets_made: AtomicU64,
    _stop_sweep: DropGuard,
}

impl<K> KeyedRateLimiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A limiter handing out `quota` to each key, with the default settings (at most
    /// [`DEFAULT_MAX_KEYS`] keys); see [`builder`](Self::builder) for the others.
    #[must_use]
    pub fn new(quota: Quota) -> Self {
        Self::builder(quota).build()
    }

    /// Takes one token from `key`'s bucket if there is one.
    #[must_use]
    pub fn allow(&self, key: &K) -> bool {
        self.check_n(key, 1).is_ok()
    }

    /// Takes `n` tokens from `key`'s bucket if they are all there.
    #[must_use]
    pub fn allow_n(&self, key: &K, n: u32) -> bool {
        self.check_n(key, n).is_ok()
    }

    /// Takes `n` tokens from `key`'s bucket if they are all there.
    ///
    /// # Errors
    ///
    /// [`CheckError::NotYet`] or [`CheckError::ExceedsBurst`].
    pub fn check_n(&self, key: &K, n: u32) -> Result<(), CheckError> {
        self.update(key, n, |rate, bucket, now| {
            match rate.step(bucket.tat, now, n) {
                Ok(tat) => {
                    bucket.tat = tat;
                    Ok(())
                }
                Err(wait) => Err(CheckError::NotYet {
                    wait: Duration::from_nanos(wait),
                }),
            }
        })
    }

    /// Waits for one token from `key`'s bucket, unless `token` is cancelled first (also when
    /// it already is).
    ///
    /// # Errors
    ///
    /// [`WaitError::Cancelled`](crate::WaitError::Cancelled); nothing is consumed then.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a token is consumed only when the future completes with `Ok`.
    pub fn wait<'a>(&'a self, token: &'a CancellationToken, key: &'a K) -> KeyedWait<'a, K> {
        self.wait_n(token, key, 1)
    }

    /// Waits for `n` tokens from `key`'s bucket, unless `token` is cancelled first.
    ///
    /// # Errors
    ///
    /// [`WaitError::Cancelled`](crate::WaitError::Cancelled) (nothing consumed), or
    /// [`WaitError::ExceedsBurst`](crate::WaitError::ExceedsBurst) at once.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`wait`](Self::wait).
    pub fn wait_n<'a>(
        &'a self,
        token: &'a CancellationToken,
        key: &'a K,
        n: u32,
    ) -> KeyedWait<'a, K> {
        KeyedWait::new(self, token, key, n)
    }

    /// The quota each key gets.
    #[must_use]
    pub fn quota(&self) -> Quota {
        self.inner.rate.quota()
    }

    /// The number of keys with a bucket now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|shard| lock(shard).len())
            .sum()
    }

    /// `true` when no key has a bucket.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes the buckets that are full again (which changes no decision); the sweep calls
    /// this periodically. Returns how many were removed.
    pub fn evict_idle(&self) -> usize {
        self.inner.evict_idle()
    }

    /// Runs `step` on `key`'s bucket (made, evicting to make room, if it has none) under its
    /// shard's lock, after the burst check.
    fn update<T>(
        &self,
        key: &K,
        n: u32,
        step: impl FnOnce(Rate, &mut Bucket, u64) -> Result<T, CheckError>,
    ) -> Result<T, CheckError> {
        let inner = &*self.inner;
        if n > inner.rate.burst {
            return Err(CheckError::ExceedsBurst {
                requested: n,
                burst: inner.rate.burst,
            });
        }
        if !inner.sweep_started.load(Ordering::Relaxed) {
            self.start_sweep();
        }
        let now = inner.clock.now();
        let (hash, mut guard) = inner.shard(key);
        let shard = match guard.find_entry(hash, |(other, _)| other == key) {
            Ok(entry) => return step(inner.rate, &mut entry.into_mut().1, now),
            Err(absent) => absent.into_table(),
        };
        if shard.len() >= inner.shard_capacity {
            make_room(shard, now, inner.shard_capacity);
        }
        let bucket = Bucket {
            tat: now,
            last_due: 0,
            born: inner.buckets_made.fetch_add(1, Ordering::Relaxed),
        };
        let entry = shard.insert_unique(hash, (key.clone(), bucket), |(key, _)| {
            inner.hasher.hash_one(key)
        });
        step(inner.rate, &mut entry.into_mut().1, now)
    }
}

/// One shard's buckets, found by the key's hash, which the call computes once: it chose the
/// shard too (std's `HashMap` would hash the key a second time).
type Shard<K> = HashTable<(K, Bucket)>;

impl<K: Hash + Eq> Inner<K> {
    /// `key`'s hash, which finds it in its shard, and that shard, locked: chosen by the
    /// hash's upper half, since the table places the key by its lower bits (keys of one shard
    /// would otherwise all share them).
    fn shard(&self, key: &K) -> (u64, MutexGuard<'_, Shard<K>>) {
        let hash = self.hasher.hash_one(key);
        let index = ((hash >> 32) as usize) % self.shards.len();
        (hash, lock(&self.shards[index]))
    }

    fn evict_idle(&self) -> usize {
        let now = self.clock.now();
        let mut removed = 0;
        for shard in &*self.shards {
            let mut shard = lock(shard);
            let before = shard.len();
            shard.retain(|(_, bucket)| bucket.tat > now);
            removed += before - shard.len();
        }
        removed
    }
}

/// A full shard frees at least a sixteenth of its capacity (and at least one slot) each
/// time it makes room, so that the scan is paid once per that many new keys rather than once
/// per new key.
const ROOM_DIVISOR: usize = 16;

/// Makes room in a full shard: drop the full buckets; if that frees less than
/// `capacity / ROOM_DIVISOR` slots (at least one), drop the buckets closest to full until it
/// does.
///
/// Freeing one slot per scan would cost a scan of the shard per new key while every bucket is
/// draining (a flood of new keys, the case the bound is for): with the default bound, 6,250
/// entries under the shard's lock per call. Freeing a sixteenth makes it one scan per
/// `capacity / 16` new keys. The price: up to that many draining buckets go before any new
/// key needs their slot, and their keys start again with a full burst; while the flood lasts
/// their slots would have been taken within the next new keys, but if it stops (or if they
/// would have refilled first), they lost their state for nothing.
fn make_room<K: Hash + Eq>(shard: &mut Shard<K>, now: u64, capacity: usize) {
    let keep = capacity - (capacity / ROOM_DIVISOR).max(1);
    // One pass drops the full buckets and notes the draining ones' times, in one allocation
    // (growing from empty would reallocate several times per scan; when every bucket is
    // full, the allocation is shared by the buckets the scan drops).
    let mut tats = Vec::with_capacity(shard.len());
    shard.retain(|(_, bucket)| {
        let draining = bucket.tat > now;
        if draining {
            tats.push(bucket.tat);
        }
        draining
    });
    if shard.len() <= keep {
        return;
    }
    let excess = shard.len() - keep;
    // The `excess` smallest theoretical arrival times are the buckets closest to full: the
    // `excess`-th smallest is the threshold; everything below it goes, and of the buckets
    // at it, as many as make up `excess` (ties: any of them, all are equally full).
    let (below, &mut threshold, _) = tats.select_nth_unstable(excess - 1);
    let mut at_threshold = excess - below.iter().filter(|&&tat| tat < threshold).count();
    shard.retain(|(_, bucket)| {
        if bucket.tat < threshold {
            false
        } else if bucket.tat == threshold && at_threshold > 0 {
            at_threshold -= 1;
            false
        } else {
            true
        }
    });
}

impl<K> Clone for KeyedRateLimiter<K> {
    fn clone(&self) -> Self {
        KeyedRateLimiter {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K> fmt::Debug for KeyedRateLimiter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRateLimiter")
            .field("interval", &Duration::from_nanos(self.inner.rate.interval))
            .field("burst", &self.inner.rate.burst)
            .field(
                "max_keys",
                &(self.inner.shard_capacity * self.inner.shards.len()),
            )
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
