//! Crashes of a whole relay process (SIGKILL) at each point of a batch, against PostgreSQL
//! and the real broker: a fresh relay then finishes the work. Nothing is lost; duplicates
//! appear only when the broker had acknowledged and the commit never happened.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use taskweave_outbox::{Event, KafkaPublisher, Relay};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::support::{
    self, commit_each, create_topic, database_url, fresh_store, kafka_brokers, read_topic,
};

/// The crash_child example, built by `cargo test` next to this test binary.
fn child_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let child = dir.join("examples").join("crash_child");
    assert!(
        child.exists(),
        "{} is missing: build it with `cargo test -p taskweave-outbox` (which builds the crate's examples with the test-hooks feature)",
        child.display()
    );
    child
}

/// Kills a relay process at `point`, then drains with a fresh relay; returns how many
/// deliveries were duplicates.
async fn kill_at(point: &str) -> usize {
    let store = fresh_store(16, 4).await;
    let topic = create_topic(2).await;
    let events: Vec<Event> = (0..30)
        .map(|i| {
            Event::new(
                &topic,
                format!("key-{}", i % 4),
                format!("{i}").into_bytes(),
            )
        })
        .collect();
    let committed: Vec<(Vec<u8>, Vec<u8>)> = events
        .iter()
        .map(|e| (e.key().to_vec(), e.payload().to_vec()))
        .collect();
    commit_each(&store, events).await;

    let mut child = tokio::process::Command::new(child_binary())
        .env("DATABASE_URL", database_url())
        .env("OUTBOX_SCHEMA", store.schema().schema())
        .env("KAFKA_BROKERS", kafka_brokers())
        .env("CRASH_POINT", point)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the relay process");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the relay process reached the point in time")
        .expect("read");
    assert_eq!(line.as_deref(), Some("REACHED"));
    child.start_kill().expect("SIGKILL");
    let status = child.wait().await.expect("wait");
    assert!(!status.success(), "killed: {status}");

    // The server notices the dead session and frees its buckets; a fresh relay finishes.
    let publisher = KafkaPublisher::new(&kafka_brokers()).expect("producer");
    let start = std::time::Instant::now();
    while store.pending().await.unwrap() > 0 {
        Relay::new(store.clone(), publisher.clone())
            .drain(
                CancellationToken::new(),
                Instant::now() + Duration::from_secs(60),
            )
            .await;
        assert!(start.elapsed() < Duration::from_secs(60), "never drained");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let consumed =
        tokio::task::spawn_blocking(move || read_topic(&topic, 2, 30, Duration::from_secs(2)))
            .await
            .unwrap();
    let delivered: Vec<(Vec<u8>, Vec<u8>)> =
        consumed.into_iter().map(|c| (c.key, c.payload)).collect();
    support::assert_per_key_order(&committed, &delivered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_before_publishing_loses_nothing_and_duplicates_nothing() {
    assert_eq!(kill_at("before-publish").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_the_acknowledgement_before_commit_republishes_the_batch() {
    let duplicates = kill_at("after-acks").await;
    assert!(duplicates >= 1, "the acknowledged batch is published again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_commit_loses_nothing_and_duplicates_nothing() {
    assert_eq!(kill_at("after-commit").await, 0);
}
