//! Public types are `Send + Sync + Unpin`.

use taskweave_periodic::{FirstRun, MissedTicks, Periodic, PeriodicReport, Schedule};

fn send_sync_unpin<T: Send + Sync + Unpin>() {}

#[test]
fn public_types_are_send_sync_and_unpin() {
    send_sync_unpin::<Periodic>();
    send_sync_unpin::<PeriodicReport>();
    send_sync_unpin::<FirstRun>();
    send_sync_unpin::<MissedTicks>();
    send_sync_unpin::<Schedule>();
}

#[test]
fn the_spawned_runner_is_send() {
    fn send<T: Send>(_: &T) {}
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let token = tokio_util::sync::CancellationToken::new();
        let handle =
            Periodic::new(std::time::Duration::from_secs(1)).spawn(token.clone(), |_| async {});
        send(&handle);
        token.cancel();
        handle.await.unwrap();
    });
}
