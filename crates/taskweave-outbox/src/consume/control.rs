//! The stop request a running consumer hands its poll thread (`Control`), and `after`,
//! the deadline a budget from now.

use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::partition::lock;

/// The stop request: a token the poll thread looks at between polls, and the deadline
/// (which `stop` may set, or move, while the poll thread already waits).
pub(super) struct Control {
    pub(super) stop: CancellationToken,
    pub(super) deadline: Mutex<Option<std::time::Instant>>,
}

impl Control {
    pub(super) fn deadline(&self) -> Option<std::time::Instant> {
        *lock(&self.deadline)
    }
}

/// `now + d`, or far ahead when that is beyond the clock's range (a "no limit" timeout).
pub(crate) fn after(d: Duration) -> std::time::Instant {
    let now = std::time::Instant::now();
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(u64::from(u32::MAX))))
        .unwrap_or(now)
}
