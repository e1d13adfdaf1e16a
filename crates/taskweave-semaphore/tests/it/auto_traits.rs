//! Public types are `Send + Sync + Unpin`.

use taskweave_semaphore::{
    AcquireError, AcquireOwned, OwnedPermit, Permit, PollSemaphore, Semaphore, TryAcquireError,
};

fn send_sync_unpin<T: Send + Sync + Unpin>() {}

#[test]
fn public_types_are_send_sync_and_unpin() {
    send_sync_unpin::<Semaphore>();
    send_sync_unpin::<Permit<'static>>();
    send_sync_unpin::<OwnedPermit>();
    send_sync_unpin::<AcquireError>();
    send_sync_unpin::<TryAcquireError>();
    send_sync_unpin::<PollSemaphore>();
}

#[test]
fn the_owned_future_is_send_and_static() {
    fn send_static<T: Send + Sync + 'static>(_: &T) {}
    let semaphore = Semaphore::new(1);
    let future: AcquireOwned = semaphore.acquire_owned(&tokio_util::sync::CancellationToken::new());
    drop(semaphore);
    send_static(&future);
}

#[test]
fn the_acquire_future_is_send() {
    fn send<T: Send>(_: &T) {}
    let semaphore = Semaphore::new(1);
    let token = tokio_util::sync::CancellationToken::new();
    let future = semaphore.acquire(&token);
    send(&future);
}
