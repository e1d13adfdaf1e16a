//! The public types are `Send + Sync` (and `Unpin`), so they cross tasks and threads.

use taskweave_outbox::*;

fn send_sync_unpin<T: Send + Sync + Unpin>() {}
fn send<T: Send>(_: &T) {}

#[test]
fn public_types_are_send_sync_unpin() {
    send_sync_unpin::<Event>();
    send_sync_unpin::<EventId>();
    send_sync_unpin::<OutboxRecord>();
    send_sync_unpin::<MemoryStore>();
    send_sync_unpin::<MemoryTransaction>();
    send_sync_unpin::<MemoryPublisher>();
    send_sync_unpin::<PgStore>();
    send_sync_unpin::<PgBatch>();
    send_sync_unpin::<KafkaPublisher>();
    send_sync_unpin::<Relay<PgStore, KafkaPublisher>>();
    send_sync_unpin::<Relay<MemoryStore, MemoryPublisher>>();
    send_sync_unpin::<RelayReport>();
    send_sync_unpin::<RelayMetricsHandle>();
    send_sync_unpin::<EnqueueError>();
    send_sync_unpin::<StoreError>();
    send_sync_unpin::<PublishError>();
    send_sync_unpin::<Schema>();
}

#[test]
fn relay_futures_can_be_spawned() {
    let relay = Relay::new(MemoryStore::new(4), MemoryPublisher::new());
    let run = relay.run(tokio_util::sync::CancellationToken::new());
    send(&run);
}
