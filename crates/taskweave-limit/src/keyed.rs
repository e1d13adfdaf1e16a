//! `KeyedRateLimiter`: one token bucket per key, with a bound on the number of keys.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::gcra::{Clock, ClockChoice, nanos};
use crate::{CheckError, WaitError};

const SHARDS: usize = 16;

/// A token bucket per key (a client, an IP address, a tenant), with memory that stays bounded
/// however many distinct keys pass through.
///
/// - At most `max_keys` buckets exist. A bucket that is full again (its key idle for long
///   enough) is the same as no bucket, so forgetting it loses nothing: the limiter's own
///   eviction task (stopped by its token, or when the limiter is dropped) removes those every
///   `sweep_every` (by default the time to refill a whole burst).
/// - When a new key arrives and its shard is full, full buckets are removed first; if every
///   bucket is still draining, the one closest to full is dropped and its key starts again
///   with a full burst. The bound therefore wins over the limit: with more keys active at
///   once than a shard holds (`max_keys` spread over up to 16 shards), the evicted keys are
///   not limited, and a client cycling through many keys can exploit that. Size `max_keys`
///   above the number of keys you expect to be active within one refill time. (governor's
///   keyed limiter grows until someone calls `retain_recent`.) Admitting a new key into a
///   full shard scans that shard. The eviction task stops when `token` is cancelled or the
///   last handle is dropped.
/// - Per key: [`allow`](Self::allow), [`check_n`](Self::check_n), [`wait`](Self::wait), with
///   the same meaning as [`RateLimiter`](crate::RateLimiter)'s.
///
/// # Examples
///
/// ```
/// use taskweave_limit::KeyedRateLimiter;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let token = CancellationToken::new();
/// let per_client = KeyedRateLimiter::new(token.clone(), 5, 2, 10_000); // 5/s, bursts of 2
/// assert!(per_client.allow(&"alice"));
/// assert!(per_client.allow(&"alice"));
/// assert!(!per_client.allow(&"alice"));
/// assert!(per_client.allow(&"bob")); // every key has its own bucket
/// assert_eq!(per_client.len(), 2);
/// token.cancel(); // stops the eviction task
/// # }
/// ```
pub struct KeyedRateLimiter<K> {
    inner: Arc<Inner<K>>,
}

struct Inner<K> {
    /// Chosen at the first use (`Clock::auto`), or earlier by `with_fast_clock` or
    /// `with_tokio_clock`.
    clock: ClockChoice,
    interval: u64,
    burst: u32,
    shard_capacity: usize,
    hasher: RandomState,
    /// Each key's theoretical arrival time (see `gcra.rs`).
    shards: Box<[Mutex<HashMap<K, u64>>]>,
    /// Stops the eviction task as soon as the last handle is dropped.
    _stop_eviction: tokio_util::sync::DropGuard,
}

impl<K> KeyedRateLimiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// `per_second` tokens per second and bursts of `burst` for each key, at most `max_keys`
    /// keys, and an eviction task that runs until `token` is cancelled or the limiter dropped.
    ///
    /// # Panics
    ///
    /// Panics if `per_second`, `burst` or `max_keys` is zero, or outside a tokio runtime.
    #[must_use]
    pub fn new(token: CancellationToken, per_second: u32, burst: u32, max_keys: usize) -> Self {
        assert!(
            per_second > 0,
            "KeyedRateLimiter::new: rate must be greater than zero"
        );
        assert!(
            per_second <= 1_000_000_000,
            "KeyedRateLimiter::new: rate must be at most 1,000,000,000 per second"
        );
        let interval = Duration::from_secs(1) / per_second;
        let refill = interval * burst;
        Self::with_sweep(token, interval, burst, max_keys, refill)
    }

    /// Like [`new`](Self::new) with one token every `interval`, and the eviction task running
    /// every `sweep_every`.
    ///
    /// # Panics
    ///
    /// Panics if `interval`, `burst`, `max_keys` or `sweep_every` is zero, or outside a tokio
    /// runtime.
    #[must_use]
    pub fn with_sweep(
        token: CancellationToken,
        interval: Duration,
        burst: u32,
        max_keys: usize,
        sweep_every: Duration,
    ) -> Self {
        assert!(
            !interval.is_zero(),
            "KeyedRateLimiter: interval must be greater than zero"
        );
        assert!(
            burst > 0,
            "KeyedRateLimiter: burst must be greater than zero"
        );
        assert!(
            max_keys > 0,
            "KeyedRateLimiter: max_keys must be greater than zero"
        );
        assert!(
            !sweep_every.is_zero(),
            "KeyedRateLimiter: sweep_every must be greater than zero"
        );
        let eviction = token.child_token();
        let inner = Arc::new(Inner {
            _stop_eviction: eviction.clone().drop_guard(),
            clock: ClockChoice::default(),
            interval: nanos(interval),
            burst,
            // Fewer shards than 16 for tiny bounds, so that shards × capacity never exceeds
            // `max_keys`.
            shard_capacity: max_keys / SHARDS.min(max_keys),
            hasher: RandomState::new(),
            shards: (0..SHARDS.min(max_keys))
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
        });
        let weak = Arc::downgrade(&inner);
        drop(taskweave_supervise::spawn(
            "keyed-limiter-eviction",
            evict_idle(eviction, weak, sweep_every),
        ));
        KeyedRateLimiter { inner }
    }

    /// Reads time from the CPU's time-stamp counter, even where tokio's clock is paused.
    /// See [`RateLimiter::with_fast_clock`](crate::RateLimiter::with_fast_clock).
    ///
    /// # Panics
    ///
    /// Panics if the limiter was already used: choose the clock right after construction.
    #[must_use]
    pub fn with_fast_clock(self) -> Self {
        self.inner
            .clock
            .choose(Clock::fast(), "KeyedRateLimiter::with_fast_clock");
        self
    }

    /// Reads time from tokio's clock, even where it runs in real time at the first use.
    /// See [`RateLimiter::with_tokio_clock`](crate::RateLimiter::with_tokio_clock).
    ///
    /// # Panics
    ///
    /// Panics if the limiter was already used: choose the clock right after construction.
    #[must_use]
    pub fn with_tokio_clock(self) -> Self {
        self.inner
            .clock
            .choose(Clock::tokio(), "KeyedRateLimiter::with_tokio_clock");
        self
    }

    /// Takes one token from `key`'s bucket if there is one.
    #[must_use]
    pub fn allow(&self, key: &K) -> bool {
        self.check_n(key, 1).is_ok()
    }

    /// Takes `n` tokens from `key`'s bucket if they are all there.
    ///
    /// # Errors
    ///
    /// [`CheckError::NotYet`] or [`CheckError::ExceedsBurst`].
    pub fn check_n(&self, key: &K, n: u32) -> Result<(), CheckError> {
        let inner = &*self.inner;
        if n > inner.burst {
            return Err(CheckError::ExceedsBurst {
                requested: n,
                burst: inner.burst,
            });
        }
        let now = inner.clock.get().now();
        let cost = inner.interval.saturating_mul(u64::from(n));
        let horizon = now.saturating_add(inner.interval.saturating_mul(u64::from(inner.burst)));
        let mut shard = inner.shard(key);
        let tat = match shard.get_mut(key) {
            Some(tat) => tat,
            None => {
                if shard.len() >= inner.shard_capacity {
                    make_room(&mut shard, now, inner.shard_capacity);
                }
                shard.entry(key.clone()).or_insert(now)
            }
        };
        let new_tat = (*tat).max(now).saturating_add(cost);
        if new_tat > horizon {
            return Err(CheckError::NotYet {
                wait: Duration::from_nanos(new_tat - horizon),
            });
        }
        *tat = new_tat;
        Ok(())
    }

    /// Waits for one token from `key`'s bucket, unless `token` is cancelled first.
    ///
    /// # Errors
    ///
    /// [`WaitError::Cancelled`]; nothing is consumed then.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a token is consumed only when the future completes with `Ok`.
    pub async fn wait(&self, token: &CancellationToken, key: &K) -> Result<(), WaitError> {
        loop {
            let wait = match self.check_n(key, 1) {
                Ok(()) => return Ok(()),
                Err(CheckError::NotYet { wait }) => wait,
                Err(CheckError::ExceedsBurst { requested, burst }) => {
                    return Err(WaitError::ExceedsBurst { requested, burst });
                }
            };
            tokio::select! {
                biased;
                () = token.cancelled() => return Err(WaitError::Cancelled),
                () = tokio::time::sleep(wait) => {}
            }
        }
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

    /// Removes the buckets that are full again (which changes no decision); the eviction task
    /// calls this periodically. Returns how many were removed.
    pub fn evict_idle(&self) -> usize {
        self.inner.evict_idle()
    }
}

impl<K> Inner<K> {}

impl<K: Hash + Eq> Inner<K> {
    fn shard(&self, key: &K) -> MutexGuard<'_, HashMap<K, u64>> {
        let index = (self.hasher.hash_one(key) as usize) % self.shards.len();
        lock(&self.shards[index])
    }

    fn evict_idle(&self) -> usize {
        let now = self.clock.get().now();
        let mut removed = 0;
        for shard in &*self.shards {
            let mut shard = lock(shard);
            let before = shard.len();
            shard.retain(|_, tat| *tat > now);
            removed += before - shard.len();
        }
        removed
    }
}

/// Makes room in a full shard: drop the full buckets, or else the one closest to full.
fn make_room<K: Hash + Eq + Clone>(shard: &mut HashMap<K, u64>, now: u64, capacity: usize) {
    shard.retain(|_, tat| *tat > now);
    if shard.len() < capacity {
        return;
    }
    let closest = shard
        .iter()
        .min_by_key(|(_, tat)| **tat)
        .map(|(key, _)| key.clone());
    if let Some(key) = closest {
        shard.remove(&key);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // No user code runs under these locks (hashing and equality of keys aside).
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn evict_idle<K: Hash + Eq>(
    token: CancellationToken,
    limiter: Weak<Inner<K>>,
    every: Duration,
) {
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    loop {
        tokio::select! {
            biased;
            () = token.cancelled() => return,
            _ = interval.tick() => {}
        }
        // The limiter was dropped: nothing left to sweep.
        let Some(inner) = limiter.upgrade() else {
            return;
        };
        // Dropping, hashing and comparing keys is user code: a panic there must not end
        // the sweep for good (later sweeps retry; the shard's lock tolerates the poison).
        let swept = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.evict_idle()));
        let removed = match swept {
            Ok(removed) => removed,
            Err(payload) => {
                let panic =
                    taskweave_supervise::PanicError::from_panic("keyed-limiter-sweep", payload);
                tracing::error!(panic = %panic.message(), "keyed limiter: a key panicked during the idle sweep; the sweep goes on");
                0
            }
        };
        if removed > 0 {
            tracing::debug!(removed, "keyed limiter: idle keys evicted");
        }
    }
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
            .field("interval", &Duration::from_nanos(self.inner.interval))
            .field("burst", &self.inner.burst)
            .field(
                "max_keys",
                &(self.inner.shard_capacity * self.inner.shards.len()),
            )
            .finish_non_exhaustive()
    }
}
