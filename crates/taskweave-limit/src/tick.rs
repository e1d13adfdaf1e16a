//! `TickLimiter`: strict spacing, never a burst.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::WaitError;

/// Lets callers through at most once per `period`, one at a time, never in a burst: Go's
/// `time.Tick` used as a limiter, without its pitfalls.
///
/// - Each [`wait`](Self::wait) gets the next free slot (`period` after the previous one) and
///   sleeps until it. Slots are handed out in call order.
/// - Missed slots are not replayed: after a quiet minute the next caller goes at once, and
///   the one after it a full period later (a token bucket with a burst of 1 would behave the
///   same; this type is for when "never two within a period" is the rule).
/// - A wait cancelled by its token (or dropped) gives its slot back if no later caller took
///   the next one; otherwise the slot stays unused.
/// - Slots are spaced exactly; when a wait returns depends also on when its task is polled,
///   so on a busy runtime two returns can be closer than a period in wall-clock time.
/// - [`close`](Self::close) makes every waiter (and later caller) return
///   [`WaitError::Closed`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_limit::TickLimiter;
/// use tokio::time::Instant;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let limiter = TickLimiter::new(Duration::from_millis(100));
/// let token = CancellationToken::new();
/// let started = Instant::now();
/// for _ in 0..3 {
///     limiter.wait(&token).await.unwrap();
/// }
/// assert_eq!(started.elapsed(), Duration::from_millis(200)); // at 0, 100 and 200 ms
/// # }
/// ```
#[derive(Clone)]
pub struct TickLimiter {
    inner: Arc<Inner>,
}

struct Inner {
    period: Duration,
    state: Mutex<State>,
    closed_notify: Notify,
}

struct State {
    /// The earliest instant the next slot may have.
    next: Instant,
    closed: bool,
}

impl TickLimiter {
    /// A limiter that lets one caller through per `period`.
    ///
    /// # Panics
    ///
    /// Panics if `period` is zero.
    #[must_use]
    pub fn new(period: Duration) -> Self {
        assert!(
            !period.is_zero(),
            "TickLimiter::new: period must be greater than zero"
        );
        TickLimiter {
            inner: Arc::new(Inner {
                period,
                state: Mutex::new(State {
                    next: Instant::now(),
                    closed: false,
                }),
                closed_notify: Notify::new(),
            }),
        }
    }

    /// Waits for the next slot, unless `token` is cancelled or the limiter closed first.
    ///
    /// # Errors
    ///
    /// [`WaitError::Cancelled`] or [`WaitError::Closed`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped wait gives its slot back like a cancelled one (when no later
    /// caller took the slot after it).
    pub async fn wait(&self, token: &CancellationToken) -> Result<(), WaitError> {
        // A cancellation observed before the slot is taken wins: no slot is taken at all.
        if token.is_cancelled() {
            return Err(WaitError::Cancelled);
        }
        let closed = self.inner.closed_notify.notified();
        let mut closed = std::pin::pin!(closed);
        closed.as_mut().enable();
        let slot = {
            let mut state = self.state();
            if state.closed {
                return Err(WaitError::Closed);
            }
            let slot = state.next.max(Instant::now());
            state.next = after(slot, self.inner.period);
            slot
        };
        let mut guard = SlotGuard {
            limiter: self,
            slot: Some(slot),
        };
        tokio::select! {
            biased;
            () = token.cancelled() => Err(WaitError::Cancelled),
            () = &mut closed => Err(WaitError::Closed),
            () = tokio::time::sleep_until(slot) => {
                guard.slot = None;
                Ok(())
            }
        }
    }

    /// Closes the limiter: every waiter returns [`WaitError::Closed`], and so do later calls.
    pub fn close(&self) {
        self.state().closed = true;
        self.inner.closed_notify.notify_waiters();
    }

    /// `true` after [`close`](Self::close).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.state().closed
    }

    /// The period.
    #[must_use]
    pub fn period(&self) -> Duration {
        self.inner.period
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // No user code runs under this lock.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Gives an unused slot back if it is still the last one handed out.
struct SlotGuard<'a> {
    limiter: &'a TickLimiter,
    slot: Option<Instant>,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            let mut state = self.limiter.state();
            if state.next == after(slot, self.limiter.inner.period) {
                state.next = slot;
            }
        }
    }
}

/// The slot one period after `slot`. A period too long for the clock (`Duration::MAX`)
/// puts the next slot 30 years ahead, which is never in practice: the first wait goes
/// through and later ones wait, instead of an overflow panic.
fn after(slot: Instant, period: Duration) -> Instant {
    slot.checked_add(period)
        .unwrap_or_else(|| slot + Duration::from_secs(60 * 60 * 24 * 365 * 30))
}

impl fmt::Debug for TickLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TickLimiter")
            .field("period", &self.inner.period)
            .field("closed", &self.is_closed())
            .finish()
    }
}
