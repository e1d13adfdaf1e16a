//! One suite of store and relay behaviour, run against both stores: the PostgreSQL store
//! (the product) and the in-memory one, so the in-memory store cannot drift from it.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt;
use taskweave_outbox::hooks::Point;
use taskweave_outbox::{
    Batch, ClaimLimits, Event, MemoryPublisher, MemoryStore, PgStore, PublishError, Relay,
    Retention, RetryPolicy, StopReason, Store,
};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::support;

/// How a suite case writes to and inspects a store.
pub(crate) trait Harness: Send + Sync + 'static {
    type S: Store + Clone;
    fn store(&self) -> Self::S;
    /// Enqueues `events` in one transaction and commits it.
    fn commit(&self, events: Vec<Event>) -> impl Future<Output = ()> + Send;
    /// Enqueues `events` in one transaction and rolls it back.
    fn rollback(&self, events: Vec<Event>) -> impl Future<Output = ()> + Send;
    /// Committed events not yet dispatched.
    fn pending(&self) -> impl Future<Output = usize> + Send;
}

pub(crate) struct Memory(pub(crate) MemoryStore);

impl Harness for Memory {
    type S = MemoryStore;
    fn store(&self) -> MemoryStore {
        self.0.clone()
    }
    async fn commit(&self, events: Vec<Event>) {
        let mut tx = self.0.begin();
        for event in events {
            tx.enqueue(event).expect("enqueue");
        }
        tx.commit();
        // A database commit waits for the server: let the relays run meanwhile.
        tokio::task::yield_now().await;
    }
    async fn rollback(&self, events: Vec<Event>) {
        let mut tx = self.0.begin();
        for event in events {
            tx.enqueue(event).expect("enqueue");
        }
        drop(tx);
    }
    async fn pending(&self) -> usize {
        self.0.pending()
    }
}

pub(crate) struct Postgres(pub(crate) PgStore);

impl Harness for Postgres {
    type S = PgStore;
    fn store(&self) -> PgStore {
        self.0.clone()
    }
    async fn commit(&self, events: Vec<Event>) {
        let mut tx = self.0.pool().begin().await.expect("begin");
        self.0
            .enqueue_batch(&mut tx, events)
            .await
            .expect("enqueue");
        self.0.commit(tx).await.expect("commit");
    }
    async fn rollback(&self, events: Vec<Event>) {
        let mut tx = self.0.pool().begin().await.expect("begin");
        self.0
            .enqueue_batch(&mut tx, events)
            .await
            .expect("enqueue");
        tx.rollback().await.expect("rollback");
    }
    async fn pending(&self) -> usize {
        usize::try_from(self.0.pending().await.expect("pending")).expect("a count")
    }
}

fn event(key: &str, payload: &str) -> Event {
    Event::new("orders", key, payload.as_bytes().to_vec())
}

fn limits(buckets: u32, events: u32) -> ClaimLimits {
    ClaimLimits {
        buckets,
        events,
        hold_at_most: Duration::from_secs(10),
    }
}

/// (key, payload) pairs of what a publisher published.
fn delivered(publisher: &MemoryPublisher) -> Vec<(Vec<u8>, Vec<u8>)> {
    publisher
        .published()
        .into_iter()
        .map(|p| (p.key, p.payload))
        .collect()
}

fn pairs(events: &[Event]) -> Vec<(Vec<u8>, Vec<u8>)> {
    events
        .iter()
        .map(|e| (e.key().to_vec(), e.payload().to_vec()))
        .collect()
}

/// Waits (polling, bounded) until `done` holds.
async fn eventually(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let start = std::time::Instant::now();
    loop {
        if done().await {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn drain<H: Harness>(h: &H, publisher: &MemoryPublisher) {
    let report = Relay::new(h.store(), publisher.clone())
        .drain(
            CancellationToken::new(),
            Instant::now() + Duration::from_secs(3600),
        )
        .await;
    assert_eq!(report.stopped, StopReason::Drained, "{report}");
}

pub(crate) async fn only_committed_events_are_claimed_in_id_order<H: Harness>(h: H) {
    h.commit(vec![event("a", "a1"), event("b", "b1"), event("a", "a2")])
        .await;
    h.rollback(vec![event("c", "never")]).await;
    assert_eq!(h.pending().await, 3);
    let batch = h.store().claim(limits(64, 100)).await.expect("claim");
    let records = batch.records();
    let payloads: Vec<&[u8]> = records.iter().map(|r| r.payload.as_slice()).collect();
    assert_eq!(payloads, [b"a1".as_slice(), b"b1", b"a2"]);
    assert!(records.windows(2).all(|w| w[0].id < w[1].id));
    assert!(
        records.iter().all(|r| r.sequence == r.id),
        "without a caller's sequence it is the id"
    );
    let ids = records.iter().map(|r| r.id).collect();
    batch.commit(ids).await.expect("commit");
    assert_eq!(h.pending().await, 0);
    let batch = h.store().claim(limits(64, 100)).await.expect("claim");
    assert!(batch.records().is_empty());
}

pub(crate) async fn open_batches_claim_disjoint_buckets<H: Harness>(h: H) {
    let events: Vec<Event> = (0..40).map(|i| event(&format!("key-{i}"), "x")).collect();
    h.commit(events).await;
    let store = h.store();
    let first = store.claim(limits(3, 1000)).await.expect("claim");
    let second = store.claim(limits(1000, 1000)).await.expect("claim");
    let buckets = |batch: &<H::S as Store>::Batch| -> HashSet<u32> {
        batch.records().iter().map(|r| r.bucket).collect()
    };
    let (a, b) = (buckets(&first), buckets(&second));
    assert_eq!(a.len(), 3);
    assert!(a.is_disjoint(&b), "{a:?} and {b:?} overlap");
    assert_eq!(first.records().len() + second.records().len(), 40);
    // A third claim finds nothing free; dropping the first (a crash) frees its buckets.
    let third = store.claim(limits(1000, 1000)).await.expect("claim");
    assert!(third.records().is_empty());
    third.commit(Vec::new()).await.expect("commit");
    let first_ids: Vec<i64> = first.records().iter().map(|r| r.id).collect();
    drop(first);
    let again = eventually_claim(&store, &a).await;
    assert_eq!(
        again.records().iter().map(|r| r.id).collect::<Vec<_>>(),
        first_ids
    );
    drop(second);
    assert_eq!(h.pending().await, 40, "nothing was marked");
}

/// Claims until the claim holds `buckets` (a dropped PostgreSQL batch frees its locks when
/// the server has seen the connection close, which takes a moment).
async fn eventually_claim<S: Store>(store: &S, buckets: &HashSet<u32>) -> S::Batch {
    let start = std::time::Instant::now();
    loop {
        let batch = store.claim(limits(1000, 1000)).await.expect("claim");
        let got: HashSet<u32> = batch.records().iter().map(|r| r.bucket).collect();
        if &got == buckets {
            return batch;
        }
        drop(batch);
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "buckets {buckets:?} never freed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(crate) async fn a_batch_reads_a_prefix_of_each_key<H: Harness>(h: H) {
    let events: Vec<Event> = (0..10).map(|i| event("k", &format!("{i}"))).collect();
    h.commit(events).await;
    let store = h.store();
    let batch = store.claim(limits(64, 3)).await.expect("claim");
    let got: Vec<&[u8]> = batch
        .records()
        .iter()
        .map(|r| r.payload.as_slice())
        .collect();
    assert_eq!(got, [b"0".as_slice(), b"1", b"2"]);
    let ids = batch.records().iter().take(2).map(|r| r.id).collect();
    batch.commit(ids).await.expect("commit");
    let batch = store.claim(limits(64, 3)).await.expect("claim");
    let got: Vec<&[u8]> = batch
        .records()
        .iter()
        .map(|r| r.payload.as_slice())
        .collect();
    assert_eq!(got, [b"2".as_slice(), b"3", b"4"]);
}

pub(crate) async fn relay_publishes_each_event_once_in_key_order<H: Harness>(h: H) {
    let events: Vec<Event> = (0..60)
        .map(|i| {
            Event::new(
                "orders",
                format!("key-{}", i % 7),
                format!("{i}").into_bytes(),
            )
            .with_header("content-type", "text/plain")
        })
        .collect();
    h.commit(events.clone()).await;
    let publisher = MemoryPublisher::new();
    drain(&h, &publisher).await;
    let published = publisher.published();
    assert_eq!(
        support::assert_per_key_order(&pairs(&events), &delivered(&publisher)),
        0
    );
    let ids: HashSet<_> = published.iter().map(|p| p.event_id).collect();
    assert_eq!(ids.len(), 60, "every event id is unique");
    for p in &published {
        let names: Vec<&str> = p.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["event_id", "event_seq", "content-type"]);
        assert_eq!(p.headers[0].1, p.event_id.to_string().into_bytes());
        assert_eq!(p.headers[1].1, p.sequence.to_string().into_bytes());
    }
    // Sequences grow per key.
    for key in 0..7 {
        let key = format!("key-{key}").into_bytes();
        let seqs: Vec<i64> = published
            .iter()
            .filter(|p| p.key == key)
            .map(|p| p.sequence)
            .collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    }
    assert_eq!(h.pending().await, 0);
}

pub(crate) async fn a_callers_sequence_is_sent<H: Harness>(h: H) {
    h.commit(vec![
        event("k", "v7").with_sequence(7),
        event("k", "v8").with_sequence(8),
    ])
    .await;
    let publisher = MemoryPublisher::new();
    drain(&h, &publisher).await;
    let seqs: Vec<i64> = publisher.published().iter().map(|p| p.sequence).collect();
    assert_eq!(seqs, [7, 8]);
}

/// Ten keys that share one bucket (of the 64 both harnesses use), the failing one first.
fn keys_in_one_bucket() -> Vec<String> {
    keys_in_poisons_bucket(10)
}

/// `"poison"` and `n - 1` other keys, all in its bucket (of 64).
fn keys_in_poisons_bucket(n: usize) -> Vec<String> {
    let bucket = taskweave_outbox::bucket_of(b"poison", 64);
    let mut keys = vec!["poison".to_owned()];
    keys.extend(
        (0..)
            .map(|i| format!("key-{i}"))
            .filter(|key| taskweave_outbox::bucket_of(key.as_bytes(), 64) == bucket)
            .take(n - 1),
    );
    keys
}

pub(crate) async fn a_failing_key_waits_alone_while_the_others_flow<H: Harness>(h: H) {
    // One bucket: every key shares it, so only per-key blocking lets the others through.
    let keys = keys_in_one_bucket();
    let mut events = Vec::new();
    for round in 0..3 {
        for key in &keys {
            events.push(event(key, &format!("{key}-{round}")));
        }
    }
    h.commit(events.clone()).await;
    let publisher = MemoryPublisher::new();
    publisher.fail_when(|record| {
        (record.key == b"poison").then(|| PublishError::retriable("broker unavailable"))
    });
    let token = CancellationToken::new();
    let relay =
        Relay::new(h.store(), publisher.clone()).with_poll_interval(Duration::from_millis(20));
    let metrics = relay.metrics();
    let running = tokio::spawn(relay.run(token.clone()));
    eventually("the other keys", async || h.pending().await == 3).await;
    assert!(publisher.published().iter().all(|p| p.key != b"poison"));
    // A batch is counted after its commit returns, a moment after the store shows it.
    eventually("the 27 counted", async || {
        metrics.snapshot().dispatched == 27
    })
    .await;
    let m = metrics.snapshot();
    assert!(m.retriable_failures >= 1 && m.held_back >= 2, "{m:?}");
    // The broker heals: the held key follows, in order.
    publisher.heal();
    eventually("the held key", async || h.pending().await == 0).await;
    token.cancel();
    running.await.expect("relay");
    assert_eq!(
        support::assert_per_key_order(&pairs(&events), &delivered(&publisher)),
        0
    );
}

pub(crate) async fn a_failed_acknowledgement_holds_its_key_and_counts_what_got_through<
    H: Harness,
>(
    h: H,
) {
    // `a1`'s acknowledgement fails after `a2` was sent: `a2` got through first, so it is
    // counted, left pending and sent again after `a1`.
    h.commit(vec![event("a", "a1"), event("a", "a2"), event("b", "b1")])
        .await;
    let publisher = MemoryPublisher::new();
    let mut once = true;
    publisher.fail_acks_when(move |record| {
        (record.payload == b"a1" && std::mem::take(&mut once))
            .then(|| PublishError::retriable("request timed out"))
    });
    let relay =
        Relay::new(h.store(), publisher.clone()).with_poll_interval(Duration::from_millis(20));
    let metrics = relay.metrics();
    let report = relay
        .drain(
            CancellationToken::new(),
            Instant::now() + Duration::from_secs(3600),
        )
        .await;
    assert_eq!(report.stopped, StopReason::Drained);
    let m = metrics.snapshot();
    assert_eq!(
        (m.sent_after_failure, m.retriable_failures, m.dispatched),
        (1, 1, 3),
        "{m:?}"
    );
    let got: Vec<Vec<u8>> = publisher
        .published()
        .into_iter()
        .map(|p| p.payload)
        .collect();
    assert_eq!(
        got,
        [
            b"a2".to_vec(),
            b"b1".to_vec(),
            b"a1".to_vec(),
            b"a2".to_vec()
        ]
    );
    assert_eq!(h.pending().await, 0);
}

pub(crate) async fn a_fatal_publisher_error_stops_the_relay_after_committing_what_went_out<
    H: Harness,
>(
    h: H,
) {
    h.commit(vec![event("a", "1"), event("b", "2"), event("c", "3")])
        .await;
    let publisher = MemoryPublisher::new();
    publisher
        .fail_when(|record| (record.key == b"b").then(|| PublishError::fatal("producer fenced")));
    let report = Relay::new(h.store(), publisher.clone())
        .run(CancellationToken::new())
        .await;
    assert_eq!(
        report.stopped,
        StopReason::PublisherFailed("producer fenced".into())
    );
    assert_eq!(
        report.dispatched, 1,
        "the record before the failure is marked: {report}"
    );
    assert_eq!(
        h.pending().await,
        2,
        "nothing after the fatal error was sent"
    );
}

pub(crate) async fn drain_waits_for_buckets_another_batch_holds<H: Harness>(h: H) {
    h.commit((0..10).map(|i| event(&format!("k{i}"), "x")).collect())
        .await;
    let store = h.store();
    let held = store.claim(limits(1000, 1000)).await.expect("claim");
    assert_eq!(held.records().len(), 10);
    let publisher = MemoryPublisher::new();
    let drain = tokio::spawn(
        Relay::new(store.clone(), publisher.clone())
            .with_poll_interval(Duration::from_millis(50))
            .with_batch_budget(Duration::from_secs(1))
            .drain(
                CancellationToken::new(),
                Instant::now() + Duration::from_secs(120),
            ),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !drain.is_finished(),
        "a drain must not stop while events are pending"
    );
    drop(held); // the other relay crashes
    let report = drain.await.expect("drain");
    assert_eq!(report.stopped, StopReason::Drained, "{report}");
    assert_eq!(report.dispatched, 10);
    assert_eq!(h.pending().await, 0);
}

pub(crate) async fn four_relays_share_the_work_and_keep_key_order<H: Harness>(
    h: H,
    events: usize,
    keys: usize,
) {
    let mut all = Vec::with_capacity(events);
    for i in 0..events {
        all.push(event(&format!("key-{}", i % keys), &format!("{i}")));
    }
    let publisher = MemoryPublisher::new();
    let token = CancellationToken::new();
    let mut relays = Vec::new();
    for n in 0..4 {
        let relay = Relay::new(h.store(), publisher.clone())
            .with_name(format!("relay-{n}"))
            .with_batch_size(100)
            .with_buckets_per_batch(8)
            .with_poll_interval(Duration::from_millis(5));
        relays.push(tokio::spawn(relay.run(token.clone())));
    }
    // Writers commit while the relays run, in transactions of a few events.
    for chunk in all.chunks(50) {
        h.commit(chunk.to_vec()).await;
    }
    eventually("every event", async || h.pending().await == 0).await;
    token.cancel();
    let mut total = 0;
    let mut working = 0;
    for relay in relays {
        let report = relay.await.expect("relay");
        total += report.dispatched;
        working += usize::from(report.dispatched > 0);
    }
    assert_eq!(total as usize, events);
    assert!(
        working >= 2,
        "the relays shared the work ({working} of 4 dispatched anything)"
    );
    assert_eq!(
        support::assert_per_key_order(&pairs(&all), &delivered(&publisher)),
        0,
        "no duplicates without faults"
    );
}

/// Aborts a relay parked at `point`, then lets a fresh relay finish; returns how many
/// events were published twice.
pub(crate) async fn crash_at<H: Harness>(h: H, point: Point) -> usize {
    let events: Vec<Event> = (0..30)
        .map(|i| event(&format!("key-{}", i % 4), &format!("{i}")))
        .collect();
    h.commit(events.clone()).await;
    let publisher = MemoryPublisher::new();
    let (reached, at_point) = oneshot::channel();
    let reached = Arc::new(std::sync::Mutex::new(Some(reached)));
    let relay = Relay::new(h.store(), publisher.clone())
        .with_batch_size(10)
        .with_hook(move |at| {
            if at == point
                && let Some(reached) = reached.lock().unwrap().take()
            {
                let _ = reached.send(());
                return futures::future::pending().boxed();
            }
            futures::future::ready(()).boxed()
        });
    let crashed = tokio::spawn(relay.run(CancellationToken::new()));
    at_point.await.expect("the relay reached the point");
    crashed.abort();
    assert!(crashed.await.expect_err("aborted").is_cancelled());
    drain_until_empty(&h, &publisher).await;
    assert_eq!(h.pending().await, 0, "nothing lost");
    support::assert_per_key_order(&pairs(&events), &delivered(&publisher))
}

/// Drains, retrying while the crashed batch's buckets are still held (a PostgreSQL
/// server notices the closed connection a moment later).
async fn drain_until_empty<H: Harness>(h: &H, publisher: &MemoryPublisher) {
    let start = std::time::Instant::now();
    while h.pending().await > 0 {
        drain(h, publisher).await;
        assert!(start.elapsed() < Duration::from_secs(60), "never drained");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(crate) async fn cancel_mid_batch_finishes_the_batch_and_starts_no_other<H: Harness>(h: H) {
    let events: Vec<Event> = (0..20).map(|i| event(&format!("key-{i}"), "x")).collect();
    h.commit(events).await;
    let publisher = MemoryPublisher::new().with_ack_delay(Duration::from_millis(200));
    let token = CancellationToken::new();
    let cancel = token.clone();
    let relay = Relay::new(h.store(), publisher.clone())
        .with_batch_size(5)
        .with_buckets_per_batch(1000)
        .with_hook(move |at| {
            // Cancelled with every record sent and no acknowledgement in yet.
            if at == Point::BeforePublish {
                cancel.cancel();
            }
            futures::future::ready(()).boxed()
        });
    let report = relay.run(token).await;
    assert_eq!(report.stopped, StopReason::Cancelled);
    assert!(report.finished_batch_after_cancel, "{report}");
    assert_eq!(report.batches, 1, "no new batch after the cancel");
    assert_eq!(report.dispatched, 5, "the batch in flight committed");
    assert_eq!(h.pending().await, 15);
    assert_eq!(publisher.published().len(), 5);
}

pub(crate) async fn a_deadline_too_close_starts_no_batch<H: Harness>(h: H) {
    h.commit(vec![event("k", "x")]).await;
    let publisher = MemoryPublisher::new();
    let claimed = Arc::new(AtomicBool::new(false));
    let seen = claimed.clone();
    let report = Relay::new(h.store(), publisher.clone())
        .with_batch_budget(Duration::from_secs(5))
        .with_hook(move |_| {
            seen.store(true, Ordering::SeqCst);
            futures::future::ready(()).boxed()
        })
        .drain(
            CancellationToken::new(),
            Instant::now() + Duration::from_secs(4),
        )
        .await;
    assert!(
        matches!(report.stopped, StopReason::DeadlineTooClose { remaining } if remaining <= Duration::from_secs(4))
    );
    assert!(!claimed.load(Ordering::SeqCst));
    assert_eq!(report.batches, 0);
    assert!(publisher.published().is_empty());
    assert_eq!(h.pending().await, 1);
}

pub(crate) async fn a_rolling_update_loses_nothing_and_keeps_order<H: Harness>(h: H) {
    let publisher = MemoryPublisher::new();
    let old_token = CancellationToken::new();
    let relay = |name: &str| {
        Relay::new(h.store(), publisher.clone())
            .with_name(name)
            .with_batch_size(20)
            .with_poll_interval(Duration::from_millis(5))
    };
    let old = tokio::spawn(relay("old pod").run(old_token.clone()));
    let mut all = Vec::new();
    let mut new = None;
    let new_token = CancellationToken::new();
    for round in 0..20 {
        let events: Vec<Event> = (0..10)
            .map(|k| event(&format!("key-{k}"), &format!("{round}-{k}")))
            .collect();
        all.extend(events.clone());
        h.commit(events).await;
        tokio::time::sleep(Duration::from_millis(3)).await;
        if round == 5 {
            new = Some(tokio::spawn(relay("new pod").run(new_token.clone())));
        }
        if round == 10 {
            old_token.cancel();
        }
    }
    let old = old.await.expect("old relay");
    eventually("every event", async || h.pending().await == 0).await;
    new_token.cancel();
    let new = new.expect("started").await.expect("new relay");
    assert_eq!((old.dispatched + new.dispatched) as usize, all.len());
    assert_eq!(
        support::assert_per_key_order(&pairs(&all), &delivered(&publisher)),
        0
    );
}

/// One poison event among 50 keys that share its bucket: while it backs off, and after it is
/// parked, the 49 other keys are all delivered; its key's later events wait behind it; an
/// operator's retry after the fix sends the key's events in order.
pub(crate) async fn a_poison_key_among_fifty_in_one_bucket_waits_alone<H: Harness>(h: H) {
    let keys = keys_in_poisons_bucket(50);
    let round = |n: usize| -> Vec<Event> {
        keys.iter()
            .map(|key| event(key, &format!("{key}-{n}")))
            .collect()
    };
    let mut all = Vec::new();
    for n in 0..3 {
        all.extend(round(n));
    }
    h.commit(all.clone()).await;
    let publisher = MemoryPublisher::new();
    publisher.fail_when(|record| {
        (record.key == b"poison").then(|| PublishError::retriable("leader not available"))
    });
    let token = CancellationToken::new();
    let relay = Relay::new(h.store(), publisher.clone())
        .with_poll_interval(Duration::from_millis(20))
        .with_retry(
            RetryPolicy::new()
                .with_max_attempts(3)
                .with_initial_delay(Duration::from_secs(2))
                .with_max_delay(Duration::from_secs(2)),
        );
    let metrics = relay.metrics();
    let running = tokio::spawn(relay.run(token.clone()));
    let store = h.store();

    // While it backs off (its second attempt comes at least a second after the first).
    eventually("the 49 other keys", async || {
        publisher.published().len() == 49 * 3 && h.pending().await == 3
    })
    .await;
    let stats = store.stats().await.expect("stats");
    assert_eq!(stats.parked, 0, "not parked yet: {stats:?}");
    assert_eq!(stats.pending, 3, "the poison key's three events: {stats:?}");
    assert!(publisher.published().iter().all(|p| p.key != b"poison"));

    // After it is parked, new events of every key: the others flow, its own wait.
    eventually("parked", async || {
        store.stats().await.expect("stats").parked == 1
    })
    .await;
    let more = round(3);
    all.extend(more.clone());
    h.commit(more).await;
    eventually("the others' new events", async || {
        publisher.published().len() == 49 * 4 && h.pending().await == 4
    })
    .await;
    let stats = store.stats().await.expect("stats");
    assert_eq!(
        (
            stats.pending,
            stats.parked,
            stats.behind_parked,
            stats.backing_off
        ),
        (0, 1, 3, 0),
        "{stats:?}"
    );
    assert!(
        stats.oldest_pending_age.is_none(),
        "a parked key is no lag: {stats:?}"
    );
    let m = metrics.snapshot();
    assert_eq!(
        (m.retriable_failures, m.backoffs, m.parked),
        (3, 2, 1),
        "{m:?}"
    );
    let parked = store.parked(10).await.expect("parked");
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].key, b"poison");
    assert_eq!(parked[0].attempts, 3);
    assert!(
        parked[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("leader not available")),
        "{parked:?}"
    );

    // The operator fixes the cause and retries the key: all four go out, in order.
    publisher.heal();
    assert_eq!(store.retry_parked_key(b"poison").await.expect("retry"), 1);
    eventually("the poison key", async || h.pending().await == 0).await;
    token.cancel();
    let report = running.await.expect("relay");
    assert_eq!(report.dispatched as usize, all.len(), "{report}");
    let left = report.left.expect("left");
    assert_eq!((left.pending, left.parked, left.behind_parked), (0, 0, 0));
    assert_eq!(
        support::assert_per_key_order(&pairs(&all), &delivered(&publisher)),
        0
    );
}

/// A permanent error parks at the first attempt; purging the parked event lets its key's
/// later events flow, and it is never published. Retry and purge refuse events that are
/// not parked.
pub(crate) async fn a_permanent_error_parks_at_once_and_purge_lets_the_key_flow<H: Harness>(h: H) {
    h.commit(vec![event("a", "bad"), event("a", "a2"), event("b", "b1")])
        .await;
    let publisher = MemoryPublisher::new();
    publisher.fail_when(|record| {
        (record.payload == b"bad").then(|| PublishError::permanent("message too large"))
    });
    let token = CancellationToken::new();
    let relay = Relay::new(h.store(), publisher.clone())
        .with_poll_interval(Duration::from_millis(20))
        .with_stats_interval(Some(Duration::from_millis(100)));
    let metrics = relay.metrics();
    let running = tokio::spawn(relay.run(token.clone()));
    let store = h.store();
    eventually("parked", async || {
        store.stats().await.expect("stats").parked == 1
    })
    .await;
    // The relay's own snapshot carries the store's counts, read every 100 ms.
    eventually("the relay's snapshot", async || {
        metrics
            .snapshot()
            .store
            .is_some_and(|(stats, _)| (stats.parked, stats.behind_parked) == (1, 1))
    })
    .await;
    let parked = store.parked(10).await.expect("parked");
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].attempts, 1);
    eventually("b1", async || publisher.published().len() == 1).await;
    assert_eq!(metrics.snapshot().permanent_failures, 1);
    assert_eq!(metrics.snapshot().backoffs, 0);

    // Neither touches an event that is not parked, nor an unknown one.
    assert!(!store.retry_parked(parked[0].id + 1).await.expect("retry"));
    assert!(!store.purge_parked(parked[0].id + 1).await.expect("purge"));
    assert!(!store.purge_parked(i64::MAX).await.expect("purge"));
    assert_eq!(store.retry_parked_key(b"b").await.expect("retry"), 0);

    assert!(store.purge_parked(parked[0].id).await.expect("purge"));
    assert!(!store.purge_parked(parked[0].id).await.expect("purged once"));
    eventually("a2", async || h.pending().await == 0).await;
    token.cancel();
    running.await.expect("relay");
    let got: Vec<Vec<u8>> = publisher
        .published()
        .into_iter()
        .map(|p| p.payload)
        .collect();
    assert_eq!(got, [b"b1".to_vec(), b"a2".to_vec()]);
    assert!(store.parked(10).await.expect("parked").is_empty());
}

/// A retried event starts its attempts from zero, and a drain waits for a retry that is
/// due before its deadline but not for a parked event.
pub(crate) async fn drain_waits_for_a_backoff_but_not_for_a_parked_event<H: Harness>(h: H) {
    h.commit(vec![
        event("flaky", "1"),
        event("dead", "2"),
        event("ok", "3"),
    ])
    .await;
    let publisher = MemoryPublisher::new();
    let mut flaky_failures = 2;
    publisher.fail_when(move |record| match record.key.as_slice() {
        b"flaky" if flaky_failures > 0 => {
            flaky_failures -= 1;
            Some(PublishError::retriable("request timed out"))
        }
        b"dead" => Some(PublishError::permanent("topic authorization failed")),
        _ => None,
    });
    let relay = Relay::new(h.store(), publisher.clone())
        .with_poll_interval(Duration::from_millis(20))
        .with_retry(RetryPolicy::new().with_initial_delay(Duration::from_millis(200)));
    let metrics = relay.metrics();
    let report = relay
        .drain(
            CancellationToken::new(),
            Instant::now() + Duration::from_secs(600),
        )
        .await;
    assert_eq!(report.stopped, StopReason::Drained, "{report}");
    assert_eq!(report.dispatched, 2, "{report}");
    let m = metrics.snapshot();
    assert_eq!((m.backoffs, m.parked), (2, 1), "{m:?}");
    let stats = h.store().stats().await.expect("stats");
    assert_eq!((stats.pending, stats.parked), (0, 1));
}

/// Retention deletes dispatched events older than the age, in bounded batches, and never a
/// pending or parked one, however old.
pub(crate) async fn retention_deletes_only_dispatched_events_older_than_the_age<H: Harness>(h: H) {
    let publisher = MemoryPublisher::new();
    publisher.fail_when(|record| {
        (record.key == b"parked").then(|| PublishError::permanent("invalid record"))
    });
    // Old: five dispatched, one parked.
    let mut old: Vec<Event> = (0..5).map(|i| event(&format!("old-{i}"), "x")).collect();
    old.push(event("parked", "p"));
    h.commit(old).await;
    drain(&h, &publisher).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // New: three dispatched now, then one left pending (no relay runs after it).
    h.commit((0..3).map(|i| event(&format!("new-{i}"), "y")).collect())
        .await;
    drain(&h, &publisher).await;
    h.commit(vec![event("pending", "z")]).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let store = h.store();
    assert_eq!(h.pending().await, 2, "the parked one and the pending one");
    // Older than 1 s: only the five, two a statement.
    let retention = Retention::new(store.clone(), Duration::from_millis(2_000)).with_batch_size(2);
    assert_eq!(
        retention
            .run_once(&CancellationToken::new())
            .await
            .expect("run"),
        5
    );
    assert_eq!(retention.deleted(), 5);
    assert_eq!(
        retention
            .run_once(&CancellationToken::new())
            .await
            .expect("run"),
        0
    );
    // A batch limit stops a run early; the next run goes on.
    let all = Retention::new(store.clone(), Duration::ZERO)
        .with_batch_size(1)
        .with_max_batches_per_run(2);
    assert_eq!(
        all.run_once(&CancellationToken::new()).await.expect("run"),
        2
    );
    assert_eq!(
        all.run_once(&CancellationToken::new()).await.expect("run"),
        1
    );
    assert_eq!(
        all.run_once(&CancellationToken::new()).await.expect("run"),
        0
    );
    // A cancelled run deletes nothing.
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    assert_eq!(all.run_once(&cancelled).await.expect("run"), 0);
    // The parked and the pending event are still there.
    assert_eq!(h.pending().await, 2);
    let stats = store.stats().await.expect("stats");
    assert_eq!((stats.pending, stats.parked), (1, 1), "{stats:?}");
    assert!(
        stats
            .oldest_pending_age
            .is_some_and(|age| age >= Duration::from_millis(1_000))
    );
}

/// A batch whose acknowledgements would run past its budget stops waiting at 80 % of it,
/// marks what was delivered, records the missing acknowledgement as a failed attempt, and
/// commits: the transaction never outlives the budget.
pub(crate) async fn a_slow_acknowledgement_is_cut_off_and_the_delivered_rest_commits<H: Harness>(
    h: H,
) {
    h.commit(vec![
        event("a", "a1"),
        event("slow", "s1"),
        event("c", "c1"),
        event("slow", "s2"),
    ])
    .await;
    let publisher = MemoryPublisher::new();
    publisher
        .delay_acks_when(|record| (record.key == b"slow").then_some(Duration::from_secs(3600)));
    let budget = Duration::from_secs(2);
    let relay = Relay::new(h.store(), publisher.clone()).with_batch_budget(budget);
    let report = relay
        .drain(
            CancellationToken::new(),
            Instant::now() + Duration::from_secs(3),
        )
        .await;
    assert!(
        matches!(report.stopped, StopReason::DeadlineTooClose { .. }),
        "{report}"
    );
    let last = report.last_batch.clone().expect("a batch");
    // The slow key's two events both missed their acknowledgement: one failed attempt (its
    // first), the second waits behind it.
    assert_eq!(
        (
            last.claimed,
            last.dispatched,
            last.failed,
            last.timed_out,
            last.backing_off
        ),
        (4, 2, 1, 1, 1),
        "{last:?}"
    );
    assert!(last.took < budget, "{last:?}");
    assert_eq!(h.pending().await, 2);
    let stats = h.store().stats().await.expect("stats");
    assert_eq!((stats.pending, stats.backing_off), (2, 1), "{stats:?}");
}

/// A drain stops as drained when the only events left back off past its deadline: it
/// does not spend the whole deadline waiting for a retry it could not make.
pub(crate) async fn drain_does_not_wait_for_a_retry_due_after_its_deadline<H: Harness>(h: H) {
    h.commit(vec![event("later", "1"), event("ok", "2")]).await;
    let publisher = MemoryPublisher::new();
    publisher.fail_when(|record| {
        (record.key == b"later").then(|| PublishError::retriable("leader not available"))
    });
    let report = Relay::new(h.store(), publisher.clone())
        .with_batch_budget(Duration::from_secs(2))
        .with_retry(RetryPolicy::new().with_initial_delay(Duration::from_secs(3600)))
        .drain(
            CancellationToken::new(),
            Instant::now() + Duration::from_secs(60),
        )
        .await;
    assert_eq!(report.stopped, StopReason::Drained, "{report}");
    assert_eq!(report.dispatched, 1);
    let left = report.left.expect("left");
    assert_eq!((left.pending, left.backing_off), (1, 1), "{left:?}");
    // With a deadline past the retry, the same store is not drained.
    assert!(
        h.store()
            .has_pending(Duration::from_secs(7200))
            .await
            .expect("has_pending")
    );
    assert!(
        !h.store()
            .has_pending(Duration::from_secs(60))
            .await
            .expect("has_pending")
    );
}
