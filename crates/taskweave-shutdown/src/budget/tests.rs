use std::time::Duration;

use proptest::prelude::*;

use super::grant;

#[test]
fn equal_weights_split_what_is_left_evenly() {
    let total = Duration::from_secs(12);
    assert_eq!(grant(total, 1, 3), Duration::from_secs(4));
    // The first phase used 1 s of its 4: the next gets half of the 11 left.
    assert_eq!(
        grant(Duration::from_secs(11), 1, 2),
        Duration::from_millis(5_500)
    );
    assert_eq!(
        grant(Duration::from_secs(5), 1, 1),
        Duration::from_secs(5),
        "the last gets all"
    );
}

#[test]
fn weights_set_the_shares() {
    assert_eq!(grant(Duration::from_secs(10), 3, 5), Duration::from_secs(6));
    assert_eq!(grant(Duration::from_secs(10), 0, 5), Duration::ZERO);
}

#[test]
fn huge_weights_still_split_the_budget_and_never_grant_more_than_is_left() {
    // The case a u32 sum got wrong: two weights near u32::MAX. The first gets about half.
    let left = u64::from(u32::MAX - 1) + u64::from(u32::MAX);
    let first = grant(Duration::from_secs(30), u32::MAX - 1, left);
    assert!(first <= Duration::from_secs(15), "{first:?}");
    assert!(first >= Duration::from_millis(14_999), "{first:?}");
    // The last step gets what is left, never more.
    let remaining = Duration::from_secs(15);
    assert_eq!(grant(remaining, u32::MAX, u64::from(u32::MAX)), remaining);
    assert_eq!(
        grant(remaining, u32::MAX, 1),
        remaining,
        "a grant is capped at what is left"
    );
}

proptest! {
    /// However the steps use their grants, no step ends past the total budget.
    #[test]
    fn grants_never_exceed_the_budget(
        weights in proptest::collection::vec(prop_oneof![0_u32..5, Just(u32::MAX - 1), Just(u32::MAX)], 1..8),
        used in proptest::collection::vec(0.0_f64..1.5, 8),
        budget_ms in 0_u64..100_000,
    ) {
        let budget = Duration::from_millis(budget_ms);
        let mut remaining = budget;
        let mut spent = Duration::ZERO;
        for (i, &weight) in weights.iter().enumerate() {
            let left: u64 = weights[i..].iter().map(|&weight| u64::from(weight)).sum();
            let granted = grant(remaining, weight, left);
            prop_assert!(granted <= remaining);
            // A step may use less than its grant, or overrun (it is cut at the grant).
            let took = granted.mul_f64(used[i]).min(granted);
            spent += took;
            remaining -= took;
        }
        prop_assert!(spent <= budget);
    }
}
