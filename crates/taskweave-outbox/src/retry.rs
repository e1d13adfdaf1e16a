//! What the relay does with an event whose publish failed: back off, or park it.

use std::fmt;
use std::time::Duration;

use crate::error::PublishErrorKind;

/// How a failing event is retried before it is parked.
///
/// A failed publish is stored on the event's row: its attempt count, the time of its next
/// attempt, and the error's text. Until that time the event, and every later event of its
/// key, waits; every other key flows, including the keys that share its bucket. After
/// [`max_attempts`](Self::with_max_attempts) failed attempts, or at once for a
/// [permanent](PublishErrorKind::Permanent) error, the event is *parked*: it and its key's
/// later events wait until an operator retries or purges it (see
/// [`Store::retry_parked`](crate::Store::retry_parked)).
///
/// The delay before attempt `n + 1`, after `n` failed attempts, is
/// `initial × 2^(n-1)`, capped at [`max_delay`](Self::with_max_delay), then spread over
/// its upper half by a jitter drawn from the event's id and attempt count (so two events
/// that failed together do not retry together, and a test sees the same delay every run).
///
/// The default: 10 attempts, 1 s initial delay, 5 min cap. The nine delays double from 1 s
/// to 256 s (the cap is not reached), 511 s at most; with the jitter an event is parked
/// between about 4.3 and 8.5 minutes after its first failure.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_outbox::RetryPolicy;
///
/// let policy = RetryPolicy::new()
///     .with_max_attempts(5)
///     .with_initial_delay(Duration::from_millis(200))
///     .with_max_delay(Duration::from_secs(10));
/// let third = policy.delay(1, 3); // after the third failure of event 1
/// assert!(third >= Duration::from_millis(400) && third <= Duration::from_millis(800));
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial: Duration,
    max: Duration,
}

impl RetryPolicy {
    /// The default policy (see the type's docs).
    #[must_use]
    pub const fn new() -> Self {
        Self {
            max_attempts: 10,
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
        }
    }

    /// Parks an event after this many failed attempts (1 parks it at its first failure).
    ///
    /// # Panics
    ///
    /// Panics if `attempts` is zero.
    #[must_use]
    pub const fn with_max_attempts(mut self, attempts: u32) -> Self {
        assert!(
            attempts > 0,
            "RetryPolicy::with_max_attempts: the count must be greater than zero"
        );
        self.max_attempts = attempts;
        self
    }

    /// The delay after the first failure.
    ///
    /// # Panics
    ///
    /// Panics if `delay` is zero.
    #[must_use]
    pub const fn with_initial_delay(mut self, delay: Duration) -> Self {
        assert!(
            !delay.is_zero(),
            "RetryPolicy::with_initial_delay: the delay must be greater than zero"
        );
        self.initial = delay;
        self
    }

    /// The longest delay between two attempts.
    ///
    /// # Panics
    ///
    /// Panics if `delay` is zero.
    #[must_use]
    pub const fn with_max_delay(mut self, delay: Duration) -> Self {
        assert!(
            !delay.is_zero(),
            "RetryPolicy::with_max_delay: the delay must be greater than zero"
        );
        self.max = delay;
        self
    }

    /// The attempt count after which an event is parked.
    #[must_use]
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The delay before the next attempt of event `id` after its `failed`-th failed attempt
    /// (`failed` ≥ 1; 0 is read as 1).
    #[must_use]
    pub fn delay(&self, id: i64, failed: u32) -> Duration {
        let failed = failed.max(1);
        let cap = self.max.max(self.initial);
        let doublings = failed.saturating_sub(1).min(63);
        let full = self
            .initial
            .checked_mul(1_u32.checked_shl(doublings).unwrap_or(u32::MAX))
            .unwrap_or(cap)
            .min(cap);
        // Equal jitter: half the delay, plus a share of the other half.
        let half = full / 2;
        let spread = (full - half).as_nanos();
        // At most 2^94 × 2^32: within u128. The product over 2^32 is at most `spread`.
        let extra = (spread * u128::from(jitter(id, failed))) >> 32;
        let extra = u64::try_from(extra / 1_000_000_000).map_or(full - half, |secs| {
            Duration::new(secs, u32::try_from(extra % 1_000_000_000).unwrap_or(0))
        });
        half + extra
    }

    /// What to do after a failure of `kind` that made `failed` failed attempts in all.
    pub(crate) fn next(&self, id: i64, failed: u32, kind: PublishErrorKind) -> NextAttempt {
        if kind != PublishErrorKind::Retriable || failed >= self.max_attempts {
            NextAttempt::Park
        } else {
            NextAttempt::After(self.delay(id, failed))
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("initial_delay", &self.initial)
            .field("max_delay", &self.max)
            .finish()
    }
}

/// A share in `[0, 2^32)` (of 2^32) drawn from `(id, attempt)`: SplitMix64's finaliser.
fn jitter(id: i64, attempt: u32) -> u64 {
    let mut z = u64::from_ne_bytes(id.to_ne_bytes())
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(u64::from(attempt));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    z >> 32
}

/// A failed publish as the relay hands it to [`Batch::complete`](crate::Batch::complete).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedAttempt {
    /// The event's outbox id.
    pub id: i64,
    /// The publisher's error, as text (stored on the row).
    pub error: String,
    /// When to try again, or park.
    pub next: NextAttempt,
}

/// What becomes of an event after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextAttempt {
    /// Try again after this long; until then the event and its key's later events wait.
    After(Duration),
    /// Park it: it and its key's later events wait for an operator.
    Park,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_with_jitter_in_the_upper_half() {
        let policy = RetryPolicy::new()
            .with_initial_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(1));
        for id in 0..200 {
            for (failed, full) in [
                (1, 100),
                (2, 200),
                (3, 400),
                (4, 800),
                (5, 1000),
                (60, 1000),
            ] {
                let delay = policy.delay(id, failed);
                let full = Duration::from_millis(full);
                assert!(
                    delay >= full / 2 && delay <= full,
                    "{id} {failed} {delay:?}"
                );
            }
        }
        // Deterministic, and spread.
        assert_eq!(policy.delay(7, 3), policy.delay(7, 3));
        let distinct: std::collections::HashSet<_> =
            (0..100).map(|id| policy.delay(id, 3)).collect();
        assert!(distinct.len() > 90);
    }

    #[test]
    fn huge_attempt_counts_and_delays_do_not_overflow() {
        let policy = RetryPolicy::new()
            .with_initial_delay(Duration::MAX)
            .with_max_delay(Duration::MAX);
        assert!(policy.delay(i64::MIN, u32::MAX) >= Duration::MAX / 2);
        assert_eq!(
            RetryPolicy::new().delay(1, 0),
            RetryPolicy::new().delay(1, 1)
        );
    }

    #[test]
    fn permanent_errors_and_the_last_attempt_park() {
        let policy = RetryPolicy::new().with_max_attempts(3);
        assert!(matches!(
            policy.next(1, 1, PublishErrorKind::Retriable),
            NextAttempt::After(_)
        ));
        assert!(matches!(
            policy.next(1, 2, PublishErrorKind::Retriable),
            NextAttempt::After(_)
        ));
        assert_eq!(
            policy.next(1, 3, PublishErrorKind::Retriable),
            NextAttempt::Park
        );
        assert_eq!(
            policy.next(1, 1, PublishErrorKind::Permanent),
            NextAttempt::Park
        );
    }
}
