//! The relay under `taskweave-shutdown`: the seed's order (finish the batch, start no new
//! one, close the pool last) with a batch in flight when the shutdown starts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use taskweave_outbox::hooks::Point;
use taskweave_outbox::{Event, MemoryPublisher, MemoryStore, Relay, StopReason};
use taskweave_shutdown::Shutdown;
use tokio_util::sync::CancellationToken;

#[tokio::test(start_paused = true)]
async fn a_shutdown_waits_for_the_batch_in_flight_before_closing_the_pool() {
    let store = MemoryStore::new(16);
    for i in 0..30 {
        store
            .enqueue(Event::new("orders", format!("k{i}"), b"x".to_vec()))
            .unwrap();
    }
    let shutdown = Shutdown::new(CancellationToken::new(), Duration::from_secs(20));
    // What the store looked like when the "database pool" closed.
    let at_close = Arc::new(Mutex::new(None));
    {
        let (store, at_close) = (store.clone(), at_close.clone());
        shutdown.resource("database pool", move |_ctx| async move {
            *at_close.lock().unwrap() = Some(store.dispatched());
        });
    }
    // Publishing takes 3 s; the shutdown starts while the first batch is in flight.
    let publisher = MemoryPublisher::new().with_ack_delay(Duration::from_secs(3));
    let trigger = shutdown.clone();
    let relay = Relay::new(store.clone(), publisher.clone())
        .with_batch_size(10)
        .with_shutdown(&shutdown)
        .with_hook(move |at| {
            if at == Point::BeforePublish {
                trigger.trigger("deploy");
            }
            futures::future::ready(()).boxed()
        });
    let running = tokio::spawn(relay.run(shutdown.token().child_token()));
    let report = shutdown.run().await;

    let relay_report = running.await.unwrap();
    assert_eq!(relay_report.stopped, StopReason::Cancelled);
    assert!(relay_report.finished_batch_after_cancel);
    assert_eq!(relay_report.batches, 1, "no batch after the trigger");
    assert_eq!(
        *at_close.lock().unwrap(),
        Some(10),
        "the pool closed after the batch committed"
    );
    let sections = report.step("critical sections").unwrap();
    assert!(sections.status.is_completed(), "{report}");
    assert!(
        sections.elapsed >= Duration::from_secs(2),
        "it waited for the batch: {report}"
    );
    assert_eq!(store.pending(), 20);
}

#[tokio::test(start_paused = true)]
async fn no_batch_starts_once_the_resources_are_closing() {
    let store = MemoryStore::new(16);
    store
        .enqueue(Event::new("orders", "k", b"x".to_vec()))
        .unwrap();
    let shutdown = Shutdown::new(CancellationToken::new(), Duration::from_secs(5));
    let report = shutdown.run_now("test").await;
    assert!(report.is_clean());
    // The relay's own token is not cancelled, but the shutdown is past its critical sections.
    let relay_report = Relay::new(store.clone(), MemoryPublisher::new())
        .with_shutdown(&shutdown)
        .run(CancellationToken::new())
        .await;
    assert_eq!(relay_report.stopped, StopReason::ShutdownClosing);
    assert_eq!(store.pending(), 1);
}
