//! Public types are `Send + Sync + Unpin`.

use taskweave_limit::{
    CheckError, KeyedRateLimiter, RateLimited, RateLimiter, Reservation, TickLimiter, WaitError,
};

fn send_sync_unpin<T: Send + Sync + Unpin>() {}

#[test]
fn public_types_are_send_sync_and_unpin() {
    send_sync_unpin::<RateLimiter>();
    send_sync_unpin::<Reservation>();
    send_sync_unpin::<TickLimiter>();
    send_sync_unpin::<KeyedRateLimiter<String>>();
    send_sync_unpin::<CheckError>();
    send_sync_unpin::<WaitError>();
    send_sync_unpin::<RateLimited<futures::stream::Iter<std::vec::IntoIter<u8>>>>();
}
