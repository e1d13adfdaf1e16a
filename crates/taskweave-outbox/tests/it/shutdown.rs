//! The relay under `taskweave-shutdown`: the seed's order (finish the batch, start no new
//! one, close the pool last) with a batch in flight when the shutdown starts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use taskweave_outbox::hooks::Point;
use taskweave_outbox::{
    ClaimLimits, Event, MemoryBatch, MemoryPublisher, MemoryStore, Nudge, OutboxStats, ParkedEvent,
    Relay, StopReason, Store, StoreError,
};
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

/// The in-memory store, but every count (`stats`, `has_pending`) takes a minute.
struct SlowCounts(MemoryStore);

const SLOW_COUNT: Duration = Duration::from_secs(60);

impl Store for SlowCounts {
    type Batch = MemoryBatch;

    async fn claim(&self, limits: ClaimLimits) -> Result<MemoryBatch, StoreError> {
        self.0.claim(limits).await
    }

    async fn has_pending(&self, within: Duration) -> Result<bool, StoreError> {
        tokio::time::sleep(SLOW_COUNT).await;
        self.0.has_pending(within).await
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        tokio::time::sleep(SLOW_COUNT).await;
        self.0.stats().await
    }

    async fn parked(&self, limit: u32) -> Result<Vec<ParkedEvent>, StoreError> {
        self.0.parked(limit).await
    }

    async fn retry_parked(&self, id: i64) -> Result<bool, StoreError> {
        self.0.retry_parked(id).await
    }

    async fn retry_parked_key(&self, key: &[u8]) -> Result<u64, StoreError> {
        self.0.retry_parked_key(key).await
    }

    async fn purge_parked(&self, id: i64) -> Result<bool, StoreError> {
        self.0.purge_parked(id).await
    }

    async fn delete_dispatched(&self, older_than: Duration, limit: u32) -> Result<u64, StoreError> {
        self.0.delete_dispatched(older_than, limit).await
    }

    fn nudge(&self) -> &Nudge {
        self.0.nudge()
    }
}

#[tokio::test(start_paused = true)]
async fn a_drain_returns_by_its_deadline_however_slowly_the_store_counts() {
    let store = SlowCounts(MemoryStore::new(8));
    store
        .0
        .enqueue(Event::new("orders", "k", b"x".to_vec()))
        .unwrap();
    let publisher = MemoryPublisher::new();
    let relay = Relay::new(store, publisher.clone())
        .with_batch_budget(Duration::from_secs(2))
        .with_stats_interval(Some(Duration::from_secs(1)));
    let start = tokio::time::Instant::now();
    let deadline = start + Duration::from_secs(5);
    let report = relay.drain(CancellationToken::new(), deadline).await;
    let now = tokio::time::Instant::now();
    assert!(
        now <= deadline,
        "returned {:?} after its deadline: {report}",
        now - deadline
    );
    assert_eq!(publisher.published().len(), 1, "the event went out first");
    assert!(
        matches!(report.stopped, StopReason::DeadlineTooClose { .. }),
        "{report}"
    );
    assert!(report.left.is_none(), "no count fits before the deadline");
}

#[test]
#[should_panic(expected = "the interval must be greater than zero")]
fn a_zero_stats_interval_is_refused() {
    let _ = Relay::new(MemoryStore::new(1), MemoryPublisher::new())
        .with_stats_interval(Some(Duration::ZERO));
}
