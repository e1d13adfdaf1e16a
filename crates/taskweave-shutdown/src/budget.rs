//! How the shutdown budget is split between phases.

use std::time::Duration;

/// The time granted to a step of weight `weight` when `remaining` is left and the steps
/// still to run (this one included) weigh `weights_left` in total: its share of what is left.
/// Time a step does not use stays in `remaining` for the next ones.
///
/// The weights are summed in `u64` (no saturation: a `u32` sum of several `u32::MAX` weights
/// would understate what is left and grant a step more than it), and a grant is never more
/// than `remaining`.
pub(crate) fn grant(remaining: Duration, weight: u32, weights_left: u64) -> Duration {
    if weights_left == 0 {
        return remaining;
    }
    let nanos = remaining.as_nanos() * u128::from(weight) / u128::from(weights_left);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)).min(remaining)
}

#[cfg(test)]
mod tests;
