//! `KeyedReservation`: tokens taken from one key by `KeyedRateLimiter::reserve_n`.

use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use super::KeyedRateLimiter;
use crate::CheckError;

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

impl<K> KeyedRateLimiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
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
        let (hash, mut shard) = inner.shard(&self.key);
        let Some(bucket) = shard
            .find_mut(hash, |(key, _)| *key == self.key)
            .map(|(_, bucket)| bucket)
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
