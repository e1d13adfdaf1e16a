//! `KeyedRateLimiterBuilder`: the settings of a `KeyedRateLimiter`, and `build`.

use std::collections::hash_map::RandomState;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hashbrown::HashTable;
use tokio_util::sync::CancellationToken;

use super::{DEFAULT_MAX_KEYS, Inner, KeyedRateLimiter, SHARDS};
use crate::Quota;
use crate::gcra::{Clock, Rate};

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
                shards: (0..shards).map(|_| Mutex::new(HashTable::new())).collect(),
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
