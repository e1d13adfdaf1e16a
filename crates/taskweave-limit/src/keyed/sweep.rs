//! The idle-key sweep of a `KeyedRateLimiter`: its task, and the guard that lets it restart.

use std::hash::Hash;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Inner, KeyedRateLimiter};

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

impl<K> KeyedRateLimiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// Starts the sweep on the current runtime, once; outside a runtime it is tried again at
    /// the next use.
    pub(super) fn start_sweep(&self) {
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

async fn evict_idle<K: Hash + Eq>(guard: SweepGuard<K>, every: Duration) {
    let SweepGuard { token, limiter } = &guard;
    let (token, limiter) = (token.clone(), limiter.clone());
    // The first sweep one period from now; every wait is raced against the token, so the
    // task ends as soon as the limiter is dropped. A period too long to add to the clock
    // (`Duration::MAX`: never sweep) waits for the token alone.
    let Some(first) = tokio::time::Instant::now().checked_add(every) else {
        token.cancelled().await;
        return;
    };
    let mut interval = tokio::time::interval_at(first, every);
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
