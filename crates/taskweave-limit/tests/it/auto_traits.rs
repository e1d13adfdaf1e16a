//! Public types are `Send + Sync + Unpin`; the wait futures are `Send`.

use taskweave_limit::{
    CheckError, KeyedRateLimiter, KeyedRateLimiterBuilder, KeyedReservation, Quota, RateLimited,
    RateLimiter, Reservation, TickLimiter, WaitError,
};
use tokio_util::sync::CancellationToken;

fn send_sync_unpin<T: Send + Sync + Unpin>() {}

#[test]
fn public_types_are_send_sync_and_unpin() {
    send_sync_unpin::<RateLimiter>();
    send_sync_unpin::<Reservation>();
    send_sync_unpin::<TickLimiter>();
    send_sync_unpin::<KeyedRateLimiter<String>>();
    send_sync_unpin::<KeyedRateLimiterBuilder<String>>();
    send_sync_unpin::<KeyedReservation<String>>();
    send_sync_unpin::<Quota>();
    send_sync_unpin::<CheckError>();
    send_sync_unpin::<WaitError>();
    send_sync_unpin::<RateLimited<futures::stream::Iter<std::vec::IntoIter<u8>>>>();
}

#[test]
fn the_wait_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let token = CancellationToken::new();
    let rate = RateLimiter::new(Quota::per_second(1));
    let keyed = KeyedRateLimiter::new(Quota::per_second(1));
    let tick = TickLimiter::new(std::time::Duration::from_secs(1));
    send(&rate.wait(&token));
    send(&keyed.wait(&token, &"key"));
    send(&tick.wait(&token));
}
