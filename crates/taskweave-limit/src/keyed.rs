//! `KeyedRateLimiter`: one token bucket per key, with a bound on the number of keys.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio_util::sync::{CancellationToken, DropGuard};

use crate::gcra::{Clock, Rate};
use crate::{CheckError, KeyedWait, Quota};
use taskweave_supervise::internal::lock;

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
/// - When a new key arrives and its shard is full, full buckets are removed first; if every
///   bucket is still draining, the one closest to full is dropped and its key starts again
///   with a full burst. The bound therefore wins over the limit: with more keys active at
///   once than a shard holds (`max_keys` spread over up to 16 shards), the evicted keys are
///   not limited, and a client cycling through many keys can exploit that. Size `max_keys`
///   above the number of keys you expect to be active within one refill time. (governor's
///   keyed limiter grows until someone calls `retain_recent`.) Admitting a new key into a
///   full shard scans that shard.
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

/// One key's state: its theoretical arrival time (see `gcra.rs`), and when its latest
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
    shards: Box<[Mutex<HashMap<K, Bucket>>]>,
    sweep_every: Duration,
    /// The sweep's token: a child of the builder's, cancelled when the last handle drops.
    sweep_token: CancellationToken,
    sweep_started: AtomicBool,
    buckets_made: AtomicU64,
    _stop_sweep: DropGuard,
}

/// Settings for a [`KeyedRateLimiter`]; [`build`](Self::build) makes it (no runtime needed).
#[derive(Debug)]
#[must_use = "a builder does nothing until `build`"]
pub struct KeyedRateLimiterBuilder<K> {
    quota: Quota,
    max_keys: usize,
    sweep_every: Option<Duration>,
    token: Option<CancellationToken>,
    tokio_clock: bool,
    _keys: PhantomData<fn() -> K>,
}

impl<K> KeyedRateLimiterBuilder<K> {
    /// At most `max_keys` buckets (default [`DEFAULT_MAX_KEYS`]).
    ///
    /// # Panics
    ///
    /// Panics if `max_keys` is zero.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        assert!(
            max_keys > 0,
            "KeyedRateLimiter: max_keys must be greater than zero"
        );
        self.max_keys = max_keys;
        self
    }

    /// Sweeps idle keys every `every` (default: the time to refill a whole burst).
    ///
    /// # Panics
    ///
    /// Panics if `every` is zero.
    pub fn sweep_every(mut self, every: Duration) -> Self {
        assert!(
            !every.is_zero(),
            "KeyedRateLimiter: sweep_every must be greater than zero"
        );
        self.sweep_every = Some(every);
        self
    }

    /// Stops the sweep when `token` is cancelled (it stops anyway when the last handle is
    /// dropped); the limiter keeps limiting, keys are then only evicted to make room.
    pub fn token(mut self, token: CancellationToken) -> Self {
        self.token = Some(token);
        self
    }

    /// Reads tokio's clock, so that tokio's paused clock drives the limiter in tests (see
    /// [`RateLimiter::with_tokio_clock`](crate::RateLimiter::with_tokio_clock)).
    pub fn tokio_clock(mut self) -> Self {
        self.tokio_clock = true;
        self
    }

    /// The limiter.
    pub fn build(self) -> KeyedRateLimiter<K> {
        let rate = Rate::new(self.quota.interval(), self.quota.burst());
        let refill = Duration::from_nanos(rate.interval.saturating_mul(u64::from(rate.burst)));
        let sweep_token = self
            .token
            .map_or_else(CancellationToken::new, |token| token.child_token());
        let shards = SHARDS.min(self.max_keys);
        KeyedRateLimiter {
            inner: Arc::new(Inner {
                clock: if self.tokio_clock {
                    Clock::tokio()
                } else {
                    Clock::fast()
                },
                rate,
                // Fewer shards than 16 for tiny bounds, so that shards × capacity never
                // exceeds `max_keys`.
                shard_capacity: self.max_keys / shards,
                hasher: RandomState::new(),
                shards: (0..shards).map(|_| Mutex::new(HashMap::new())).collect(),
                sweep_every: self
                    .sweep_every
                    .unwrap_or(refill)
                    .max(Duration::from_millis(1)),
                _stop_sweep: sweep_token.clone().drop_guard(),
                sweep_token,
                sweep_started: AtomicBool::new(false),
                buckets_made: AtomicU64::new(0),
            }),
        }
    }
}

impl<K> KeyedRateLimiter<K> {
    /// Settings for a limiter handing out `quota` to each key.
    pub fn builder(quota: Quota) -> KeyedRateLimiterBuilder<K> {
        KeyedRateLimiterBuilder {
            quota,
            max_keys: DEFAULT_MAX_KEYS,
            sweep_every: None,
            token: None,
            tokio_clock: false,
            _keys: PhantomData,
        }
    }
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

    /// Takes `n` tokens from `key`'s bucket now or in the future; see
    /// [`RateLimiter::reserve_n`](crate::RateLimiter::reserve_n).
    ///
    /// # Errors
    ///
    /// [`CheckError::ExceedsBurst`], or `CheckError::NotYet { wait: Duration::MAX }` when the
    /// key is already reserved beyond the clock's range (about 584 years ahead).
    pub fn reserve_n(&self, key: &K, n: u32) -> Result<KeyedReservation<K>, CheckError> {
        let clock = &self.inner.clock;
        let (delay, due, born) = self.update(key, n, |rate, bucket, now| {
            let Some((tat, delay)) = rate.reserve(bucket.tat, now, n, u64::MAX) else {
                return Err(CheckError::NotYet {
                    wait: Duration::MAX,
                });
            };
            bucket.tat = tat;
            let due = now.saturating_add(delay);
            bucket.last_due = bucket.last_due.max(due);
            Ok((delay, due, bucket.born))
        })?;
        Ok(KeyedReservation {
            limiter: self.clone(),
            key: key.clone(),
            tokens: n,
            due: clock.instant(due),
            due_at: due,
            delay: Duration::from_nanos(delay),
            born,
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
        let mut shard = inner.shard(key);
        let bucket = match shard.get_mut(key) {
            Some(bucket) => bucket,
            None => {
                if shard.len() >= inner.shard_capacity {
                    make_room(&mut shard, now, inner.shard_capacity);
                }
                shard.entry(key.clone()).or_insert(Bucket {
                    tat: now,
                    last_due: 0,
                    born: inner.buckets_made.fetch_add(1, Ordering::Relaxed),
                })
            }
        };
        step(inner.rate, bucket, now)
    }

    /// Starts the sweep on the current runtime, once; outside a runtime it is tried again at
    /// the next use.
    fn start_sweep(&self) {
        let inner = &self.inner;
        if tokio::runtime::Handle::try_current().is_err()
            || inner.sweep_token.is_cancelled()
            || inner
                .sweep_started
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        drop(taskweave_supervise::spawn(
            "keyed-limiter-sweep",
            evict_idle(
                SweepGuard {
                    token: inner.sweep_token.clone(),
                    limiter: Arc::downgrade(inner),
                },
                inner.sweep_every,
            ),
        ));
    }
}

/// Tokens taken from one key by [`KeyedRateLimiter::reserve_n`], due after
/// [`delay`](Self::delay). Dropping it keeps them; [`cancel`](Self::cancel) gives back what is
/// still in the future.
#[must_use = "a reservation takes tokens; cancel it to give them back"]
pub struct KeyedReservation<K: Hash + Eq> {
    limiter: KeyedRateLimiter<K>,
    key: K,
    tokens: u32,
    due: tokio::time::Instant,
    due_at: u64,
    delay: Duration,
    /// The bucket it was taken from.
    born: u64,
}

impl<K: Hash + Eq> KeyedReservation<K> {
    /// How long after the reservation the tokens were due (zero: at once).
    #[must_use]
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// When the tokens are due.
    #[must_use]
    pub fn due(&self) -> tokio::time::Instant {
        self.due
    }

    /// Waits until the tokens are due.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the reservation is unchanged.
    pub async fn ready(&self) {
        tokio::time::sleep_until(self.due).await;
    }

    /// Gives back what is still in the future, with the rules of
    /// [`Reservation::cancel`](crate::Reservation::cancel). If the key's bucket was evicted in
    /// the meantime there is nothing to give back to.
    pub fn cancel(self) {
        let inner = &*self.limiter.inner;
        let now = inner.clock.now();
        if self.due_at < now {
            return;
        }
        let mut shard = inner.shard(&self.key);
        let Some(bucket) = shard
            .get_mut(&self.key)
            .filter(|bucket| bucket.born == self.born)
        else {
            return;
        };
        let cost = inner.rate.interval.saturating_mul(u64::from(self.tokens));
        let refund = cost.saturating_sub(bucket.last_due.saturating_sub(self.due_at));
        bucket.tat = bucket.tat.saturating_sub(refund).max(now.min(bucket.tat));
        if bucket.last_due == self.due_at {
            let before = self.due_at.saturating_sub(cost);
            if before >= now {
                bucket.last_due = before;
            }
        }
    }
}

impl<K: Hash + Eq> fmt::Debug for KeyedReservation<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedReservation")
            .field("tokens", &self.tokens)
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq> Inner<K> {
    fn shard(&self, key: &K) -> MutexGuard<'_, HashMap<K, Bucket>> {
        let index = (self.hasher.hash_one(key) as usize) % self.shards.len();
        lock(&self.shards[index])
    }

    fn evict_idle(&self) -> usize {
        let now = self.clock.now();
        let mut removed = 0;
        for shard in &*self.shards {
            let mut shard = lock(shard);
            let before = shard.len();
            shard.retain(|_, bucket| bucket.tat > now);
            removed += before - shard.len();
        }
        removed
    }
}

/// Makes room in a full shard: drop the full buckets, or else the one closest to full.
fn make_room<K: Hash + Eq + Clone>(shard: &mut HashMap<K, Bucket>, now: u64, capacity: usize) {
    shard.retain(|_, bucket| bucket.tat > now);
    if shard.len() < capacity {
        return;
    }
    let closest = shard
        .iter()
        .min_by_key(|(_, bucket)| bucket.tat)
        .map(|(key, _)| key.clone());
    if let Some(key) = closest {
        shard.remove(&key);
    }
}

/// Lets the sweep start again at the next use when its task is dropped while the limiter is
/// still wanted (its runtime shut down): made outside the task's future, so it also runs when
/// the task is dropped before its first poll.
struct SweepGuard<K> {
    token: CancellationToken,
    limiter: Weak<Inner<K>>,
}

impl<K> Drop for SweepGuard<K> {
    fn drop(&mut self) {
        if !self.token.is_cancelled()
            && let Some(inner) = self.limiter.upgrade()
        {
            inner.sweep_started.store(false, Ordering::Release);
        }
    }
}

async fn evict_idle<K: Hash + Eq>(guard: SweepGuard<K>, every: Duration) {
    let SweepGuard { token, limiter } = &guard;
    let (token, limiter) = (token.clone(), limiter.clone());
    // The first sweep one period from now; every wait is raced against the token, so the
    // task ends as soon as the limiter is dropped.
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
            .field("interval", &Duration::from_nanos(self.inner.rate.interval))
            .field("burst", &self.inner.rate.burst)
            .field(
                "max_keys",
                &(self.inner.shard_capacity * self.inner.shards.len()),
            )
            .finish_non_exhaustive()
    }
}
