//! The PostgreSQL store's own behaviour: migration, enqueue in the caller's transaction,
//! bad input, the claim's plan, per-key commit order, and connections never returned to the
//! pool inside a transaction.

use std::time::Duration;

use sqlx::{AssertSqlSafe, Row};
use taskweave_outbox::{
    Batch, ClaimLimits, EnqueueError, Event, InvalidEvent, Limits, MemoryPublisher, PgStore, Relay,
    Schema, StopReason, Store, StoreError, migrate,
};

use tokio_util::sync::CancellationToken;

use crate::support::{fresh_store, pool, pool_named, unique_name};

fn limits() -> ClaimLimits {
    ClaimLimits {
        buckets: 64,
        events: 1000,
        hold_at_most: Duration::from_secs(10),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent_concurrent_safe_and_checks_the_bucket_count() {
    let pool = pool(8).await;
    let schema = Schema::new(&unique_name("m")).with_table_prefix("app_outbox_");
    let runs = (0..4).map(|_| {
        let pool = pool.clone();
        let schema = schema.clone();
        tokio::spawn(async move { migrate(&pool, &schema, 32).await })
    });
    for run in runs {
        assert_eq!(run.await.unwrap().expect("migrate"), 2);
    }
    assert_eq!(migrate(&pool, &schema, 32).await.expect("again"), 2);
    match migrate(&pool, &schema, 64).await {
        Err(StoreError::BucketCountMismatch {
            stored: 32,
            requested: 64,
        }) => {}
        other => panic!("expected a bucket-count mismatch, got {other:?}"),
    }
    let store = PgStore::connect(pool.clone(), schema.clone())
        .await
        .expect("connect");
    assert_eq!(store.buckets(), 32);
    let buckets: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {}",
        schema.buckets_table()
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(buckets, 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_before_migrating_names_the_fix() {
    let pool = pool(2).await;
    match PgStore::connect(pool, Schema::new(&unique_name("none"))).await {
        Err(error @ StoreError::NotMigrated(_)) => {
            assert!(error.to_string().contains("migrate"), "{error}")
        }
        other => panic!("expected NotMigrated, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_before_anything_is_written() {
    let store = fresh_store(8, 4).await.with_limits(Limits {
        max_payload_bytes: 100,
        max_key_bytes: 8,
        max_headers: 4,
        max_header_bytes: 10,
    });
    let mut tx = store.pool().begin().await.unwrap();
    let cases = [
        (Event::new("", "k", b"x".to_vec()), InvalidEvent::EmptyTopic),
        (
            Event::new("t", "k", vec![0; 101]),
            InvalidEvent::PayloadTooLarge {
                len: 101,
                limit: 100,
            },
        ),
        (
            Event::new("t", "123456789", b"x".to_vec()),
            InvalidEvent::KeyTooLong { len: 9, limit: 8 },
        ),
        (
            Event::new("t", "k", b"x".to_vec())
                .with_header("a", "1234")
                .with_header("b", vec![0; 5]),
            InvalidEvent::HeadersTooLarge { len: 11, limit: 10 },
        ),
    ];
    for (event, expected) in cases {
        match store.enqueue(&mut tx, event).await {
            Err(EnqueueError::Invalid { reason, .. }) => assert_eq!(reason, expected),
            other => panic!("expected {expected:?}, got {other:?}"),
        }
    }
    // A batch names the refused event and writes none of them.
    let batch = vec![
        Event::new("t", "k", b"ok".to_vec()),
        Event::new("t", "k", vec![0; 101]),
    ];
    match store.enqueue_batch(&mut tx, batch).await {
        Err(EnqueueError::Invalid { index: 1, .. }) => {}
        other => panic!("expected event 1 refused, got {other:?}"),
    }
    // Nothing reached the server, so the transaction is still usable.
    store.commit(tx).await.expect("commit");
    assert_eq!(store.pending().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_commits_and_rolls_back_with_the_business_data() {
    let store = fresh_store(8, 4).await;
    let orders = format!("\"{}\".orders", store.schema().schema());
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {orders} (id bigint PRIMARY KEY)"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    for (id, commit) in [(1_i64, false), (2, true)] {
        let mut tx = store.pool().begin().await.unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {orders} (id) VALUES ($1)"
        )))
        .bind(id)
        .execute(&mut *tx)
        .await
        .unwrap();
        store
            .enqueue(
                &mut tx,
                Event::new("order-events", format!("order-{id}"), b"created".to_vec()),
            )
            .await
            .unwrap();
        if commit {
            store.commit(tx).await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
    }
    let order_ids: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!("SELECT id FROM {orders}")))
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(order_ids, [2]);
    let batch = store.claim(limits()).await.unwrap();
    let keys: Vec<&[u8]> = batch.records().iter().map(|r| r.key.as_slice()).collect();
    assert_eq!(keys, [b"order-2".as_slice()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_reads_the_pending_partial_index_with_many_dispatched_rows() {
    let store = fresh_store(64, 4).await;
    let events = store.schema().events_table();
    // 100,000 dispatched rows and 200 pending ones, written directly; the first ten pending
    // ones are parked (each the only pending row of its key).
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {events} (event_id, bucket, topic, key, payload, headers, dispatched_at, parked_at, attempts)
         SELECT gen_random_uuid(), g % 64, 't', convert_to('k' || g % 500, 'UTF8'), '\\x00', '\\x00000000',
                CASE WHEN g <= 100000 THEN now() END,
                CASE WHEN g BETWEEN 100001 AND 100010 THEN now() END,
                CASE WHEN g BETWEEN 100001 AND 100010 THEN 3 ELSE 0 END
         FROM generate_series(1, 100200) g"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    sqlx::query(AssertSqlSafe(format!("ANALYZE {events}")))
        .execute(store.pool())
        .await
        .unwrap();
    let plan = explain(&store, store.claim_events_sql(), |query| {
        query.bind(vec![1_i32, 2, 3, 4]).bind(500_i64)
    })
    .await;
    let index = format!("{}events_ready", "outbox_");
    assert!(
        plan.contains(&index),
        "the claim must read {index}:\n{plan}"
    );
    assert!(
        !plan.contains("Seq Scan") && !plan.contains("events_pkey"),
        "no scan over dispatched rows:\n{plan}"
    );
    let held = format!("{}events_held", "outbox_");
    assert!(
        plan.contains(&held),
        "held keys are found on {held}:\n{plan}"
    );
    let plan = explain(&store, store.claim_buckets_sql(), |query| {
        query.bind(16_i64)
    })
    .await;
    assert!(
        plan.contains(&index) && !plan.contains("Seq Scan on outbox_events"),
        "{plan}"
    );
    // And the claim itself returns the 200 pending rows' first batch.
    let batch = store
        .claim(ClaimLimits {
            buckets: 64,
            events: 500,
            hold_at_most: Duration::from_secs(10),
        })
        .await
        .unwrap();
    assert_eq!(
        batch.records().len(),
        190,
        "every pending row but the parked ones"
    );
    assert!(batch.records().iter().all(|r| r.id > 100_010));
    drop(batch);
    // The counts read the pending rows only.
    let plan = explain(&store, store.stats_sql(), |query| query).await;
    assert!(
        plan.contains(&index) && !plan.contains("Seq Scan on outbox_events"),
        "{plan}"
    );
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.pending, stats.parked), (190, 10));
    // Retention walks the dispatched index, oldest first.
    let plan = explain(&store, store.delete_dispatched_sql(), |query| {
        query.bind(1_000_i64).bind(1_000_i64)
    })
    .await;
    let dispatched = format!("{}events_dispatched", "outbox_");
    assert!(plan.contains(&dispatched), "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_left_at_version_1_upgrades_and_keeps_its_events() {
    let pool = pool(4).await;
    let schema = Schema::new(&unique_name("v1"));
    assert_eq!(
        taskweave_outbox::migrate_up_to(&pool, &schema, 8, 1)
            .await
            .unwrap(),
        1
    );
    // A row as version 1 wrote it, and a relay of this version refusing the old schema.
    let events = schema.events_table();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {events} (event_id, bucket, topic, key, payload, headers)
         VALUES (gen_random_uuid(), 3, 'orders', 'k', 'old', '\\x00000000')"
    )))
    .execute(&pool)
    .await
    .unwrap();
    match PgStore::connect(pool.clone(), schema.clone()).await {
        Err(StoreError::NotMigrated(why)) => assert!(why.contains("version 1"), "{why}"),
        other => panic!("expected NotMigrated, got {other:?}"),
    }
    assert_eq!(migrate(&pool, &schema, 8).await.unwrap(), 2);
    let store = PgStore::connect(pool, schema).await.unwrap();
    let batch = store.claim(limits()).await.unwrap();
    assert_eq!(batch.records().len(), 1);
    assert_eq!(
        (
            batch.records()[0].payload.as_slice(),
            batch.records()[0].attempts
        ),
        (&b"old"[..], 0)
    );
}

/// With `with_notify`, a relay whose store is another instance (another process, as far as
/// nudges go) and whose poll interval is an hour wakes at the commit; and after its
/// listening connection is killed it reconnects and wakes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_a_relay_in_another_process_and_survives_a_lost_connection() {
    let name = unique_name("listen");
    let pool = pool_named(6, &name).await;
    let schema = Schema::new(&unique_name("n"));
    migrate(&pool, &schema, 8).await.unwrap();
    let writer = PgStore::connect(pool.clone(), schema.clone())
        .await
        .unwrap()
        .with_notify(true);
    let relay_store = PgStore::connect(pool.clone(), schema)
        .await
        .unwrap()
        .with_notify(true);
    let publisher = taskweave_outbox::MemoryPublisher::new();
    let token = tokio_util::sync::CancellationToken::new();
    // An hour between polls, also just after work: only a notification wakes it.
    let relay = taskweave_outbox::Relay::new(relay_store, publisher.clone())
        .with_poll_interval(Duration::from_secs(3600))
        .with_min_poll_interval(Duration::from_secs(3600));
    let metrics = relay.metrics();
    let running = tokio::spawn(relay.run(token.clone()));
    let listening = async || {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'",
        )
        .bind(&name)
        .fetch_one(&pool)
        .await
        .unwrap()
            == 1
    };
    let wait_for = async |what: &str, done: &mut dyn FnMut() -> bool| {
        let start = std::time::Instant::now();
        while !done() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let start = std::time::Instant::now();
    while !listening().await {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the listener never listened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for("the first poll", &mut || {
        metrics.snapshot().empty_polls >= 1
    })
    .await;

    for round in 0..2_usize {
        let mut tx = pool.begin().await.unwrap();
        writer
            .enqueue(&mut tx, Event::new("orders", "k", vec![0]))
            .await
            .unwrap();
        // A plain commit: no in-process nudge, only the notification.
        tx.commit().await.unwrap();
        wait_for("the notified relay", &mut || {
            publisher.published().len() == round + 1
        })
        .await;
        if round == 0 {
            // Kill the listening connection; sqlx connects again.
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'",
            )
            .bind(&name)
            .execute(&pool)
            .await
            .unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            let start = std::time::Instant::now();
            while !listening().await {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "the listener never came back"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    token.cancel();
    let report = running.await.unwrap();
    assert_eq!(report.dispatched, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_of_one_key_commit_in_id_order_and_other_keys_never_wait() {
    let name = unique_name("lock");
    let pool = pool_named(6, &name).await;
    let schema = Schema::new(&name);
    migrate(&pool, &schema, 8).await.unwrap();
    let store = PgStore::connect(pool, schema).await.unwrap();
    let mut first = store.pool().begin().await.unwrap();
    store
        .enqueue(&mut first, Event::new("t", "hot", b"first".to_vec()))
        .await
        .unwrap();
    // Another key goes through while `first` is open.
    let mut other = store.pool().begin().await.unwrap();
    store
        .enqueue(&mut other, Event::new("t", "cold", b"other".to_vec()))
        .await
        .unwrap();
    store.commit(other).await.unwrap();
    // A second writer of the same key, on a connection in autocommit (where the lock and
    // the insert must still be one transaction), waits for `first` to commit.
    let second = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut conn = store.pool().acquire().await.unwrap();
            store
                .enqueue(&mut conn, Event::new("t", "hot", b"second".to_vec()))
                .await
                .unwrap();
        })
    };
    let start = std::time::Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE application_name = $1 AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
        )
        .bind(&name)
        .fetch_one(store.pool())
        .await
        .unwrap();
        if waiting == 1 {
            break;
        }
        assert!(
            !second.is_finished(),
            "the second writer did not wait for the first"
        );
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the second writer never blocked"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    store.commit(first).await.unwrap();
    second.await.unwrap();
    let batch = store.claim(limits()).await.unwrap();
    let hot: Vec<&[u8]> = batch
        .records()
        .iter()
        .filter(|r| r.key == b"hot")
        .map(|r| r.payload.as_slice())
        .collect();
    assert_eq!(
        hot,
        [b"first".as_slice(), b"second"],
        "id order is commit order for the key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_dropped_halfway_never_returns_its_connection_inside_a_transaction() {
    // One connection in the pool: if a dropped batch gave it back inside its transaction,
    // every later query would fail (sqlx issue 4393) or block on the held buckets.
    let name = unique_name("drop");
    let pool = pool_named(1, &name).await;
    let observer = crate::support::pool(1).await;
    let schema = Schema::new(&name);
    migrate(&pool, &schema, 4).await.unwrap();
    let store = PgStore::connect(pool.clone(), schema).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    store
        .enqueue(&mut tx, Event::new("t", "k", b"x".to_vec()))
        .await
        .unwrap();
    store.commit(tx).await.unwrap();
    for _ in 0..5 {
        let batch = claim_until_found(&store).await;
        drop(batch);
    }
    // A claim future dropped at its first await point, too.
    for _ in 0..5 {
        let claim = store.claim(limits());
        let _ = tokio::time::timeout(Duration::from_micros(1), claim).await;
    }
    // No session of this pool sits inside a transaction (the pool's one connection among them).
    let in_transaction = crate::support::sessions_in_transaction(&observer, &name).await;
    assert_eq!(
        in_transaction, 0,
        "a pooled connection was left inside a transaction"
    );
    // The event is still pending and claimable.
    let batch = claim_until_found(&store).await;
    let id = batch.records()[0].id;
    batch.commit(vec![id]).await.unwrap();
    assert_eq!(store.pending().await.unwrap(), 0);
}

/// Claims until the one pending event is claimable (a dropped batch's connection is closed
/// at once, but the server frees its locks when it notices, a moment later).
async fn claim_until_found(store: &PgStore) -> taskweave_outbox::PgBatch {
    let start = std::time::Instant::now();
    loop {
        let batch = store.claim(limits()).await.unwrap();
        if batch.records().len() == 1 {
            return batch;
        }
        drop(batch);
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the dropped batch's bucket was never freed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_row_holds_back_its_key_only() {
    let store = fresh_store(1, 4).await;
    crate::support::commit_each(
        &store,
        vec![
            Event::new("t", "bad", b"1".to_vec()),
            Event::new("t", "bad", b"2".to_vec()),
            Event::new("t", "good", b"3".to_vec()),
        ],
    )
    .await;
    corrupt_first_row(&store).await;
    let batch = store.claim(limits()).await.expect("the claim still works");
    let payloads: Vec<&[u8]> = batch
        .records()
        .iter()
        .map(|r| r.payload.as_slice())
        .collect();
    assert_eq!(payloads, [b"3".as_slice()], "only the other key is read");
    // Completing the batch parks the unreadable row, with its reason, for an operator.
    let id = batch.records()[0].id;
    batch.commit(vec![id]).await.unwrap();
    let parked = store.parked(10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].key, b"bad");
    assert!(
        parked[0]
            .last_error
            .as_deref()
            .is_some_and(|error| error.contains("unreadable")),
        "{:?}",
        parked[0].last_error
    );
}

/// Writes a waiting event of `key` straight into the table (as a writer racing the relay's
/// release can leave one).
async fn insert_waiting(store: &PgStore, key: &str) {
    let events = store.schema().events_table();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {events} (event_id, bucket, topic, key, payload, headers, waiting)
         VALUES (gen_random_uuid(), 0, 'orders', $1, 'x', '\\x00000000', true)"
    )))
    .bind(key.as_bytes())
    .execute(store.pool())
    .await
    .unwrap();
}

/// Corrupts the first row's headers behind the outbox's back.
async fn corrupt_first_row(store: &PgStore) {
    let events = store.schema().events_table();
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {events} SET headers = '\\xffffffff' WHERE id = (SELECT min(id) FROM {events})"
    )))
    .execute(store.pool())
    .await
    .unwrap();
}

/// A key with more unreadable-blocked rows than a claim reads must not fill every claim of
/// its bucket: its first row is parked at the first batch, and the other keys of the bucket
/// go out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_behind_an_unreadable_row_never_starves_its_bucket() {
    let store = fresh_store(1, 4).await;
    let mut events: Vec<Event> = (0..6).map(|n| Event::new("t", "bad", vec![n])).collect();
    events.extend((0..3).map(|n| Event::new("t", format!("good-{n}"), vec![n])));
    crate::support::commit_each(&store, events).await;
    corrupt_first_row(&store).await;
    let publisher = MemoryPublisher::new();
    let report = Relay::new(store.clone(), publisher.clone())
        .with_batch_size(4)
        .drain(
            CancellationToken::new(),
            tokio::time::Instant::now() + Duration::from_secs(30),
        )
        .await;
    let mut keys: Vec<Vec<u8>> = publisher
        .published()
        .into_iter()
        .map(|record| record.key)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [b"good-0".to_vec(), b"good-1".to_vec(), b"good-2".to_vec()],
        "{report}"
    );
    assert!(matches!(report.stopped, StopReason::Drained), "{report}");
    let parked = store.parked(10).await.unwrap();
    assert_eq!((parked.len(), parked[0].key.as_slice()), (1, &b"bad"[..]));
}

/// The plan of `statement`, with its parameters bound by `bind`.
async fn explain(
    store: &PgStore,
    statement: &str,
    bind: impl FnOnce(PgQuery<'_>) -> PgQuery<'_>,
) -> String {
    let query = sqlx::query(AssertSqlSafe(format!("EXPLAIN {statement}")));
    let rows = bind(query).fetch_all(store.pool()).await.unwrap();
    rows.iter()
        .map(|row| row.get::<String, _>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// The session backstop: a batch held open past its hold time (a relay hung mid-batch) is
/// cut off by the server, which frees its buckets for the next claim; its commit then fails
/// and nothing it held is marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_held_past_its_hold_time_is_cut_off_by_the_server() {
    let store = fresh_store(4, 4).await;
    crate::support::commit_each(&store, vec![Event::new("orders", "k", b"x".to_vec())]).await;
    let short = ClaimLimits {
        buckets: 4,
        events: 10,
        hold_at_most: Duration::from_secs(1),
    };
    let hung = store.claim(short).await.unwrap();
    assert_eq!(hung.records().len(), 1);
    assert!(
        store.claim(short).await.unwrap().records().is_empty(),
        "held"
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let next = store.claim(short).await.unwrap();
    assert_eq!(
        next.records().len(),
        1,
        "the server freed the hung batch's bucket"
    );
    let id = next.records()[0].id;
    assert!(
        hung.commit(vec![id]).await.is_err(),
        "the hung batch's session is gone"
    );
    next.commit(vec![id]).await.unwrap();
    assert_eq!(store.pending().await.unwrap(), 0);
}

/// Releasing waiting events is bounded in all, not per key, so that a call makes progress
/// under its statement timeout however many keys recovered at once; repeated calls release
/// the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_waiting_events_is_bounded_in_all_and_finishes_over_calls() {
    let store = fresh_store(1, 6).await;
    let events = store.schema().events_table();
    // Three keys with five waiting events each and no failed event ahead of them.
    for key in ["a", "b", "c"] {
        for _ in 0..5 {
            insert_waiting(&store, key).await;
        }
    }
    let mut calls = Vec::new();
    loop {
        let released = store.release_held_back(4).await.unwrap();
        if released == 0 {
            break;
        }
        calls.push(released);
        assert!(calls.len() < 10, "never finished: {calls:?}");
    }
    assert_eq!(
        calls,
        [4, 4, 4, 3],
        "at most the limit per call, all in the end"
    );
    let waiting: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {events} WHERE waiting"
    )))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(waiting, 0);
}

/// A parked key's later events wait outside the claim's index (they are never walked), are
/// counted as behind the parked one, and go out in order once it is purged; a waiting
/// event whose key has no failed event left (a writer that raced the relay) is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_keys_backlog_waits_outside_the_claims_index() {
    let store = fresh_store(1, 6).await;
    crate::support::commit_each(
        &store,
        vec![Event::new("orders", "hot", b"poison".to_vec())],
    )
    .await;
    let publisher = taskweave_outbox::MemoryPublisher::new();
    publisher.fail_when(|record| {
        (record.payload == b"poison")
            .then(|| taskweave_outbox::PublishError::permanent("too large"))
    });
    let token = tokio_util::sync::CancellationToken::new();
    let relay = taskweave_outbox::Relay::new(store.clone(), publisher.clone())
        .with_poll_interval(Duration::from_millis(20));
    let running = tokio::spawn(relay.run(token.clone()));
    let until = async |what: &str, done: &mut dyn FnMut() -> bool| {
        let start = std::time::Instant::now();
        while !done() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let start = std::time::Instant::now();
    while store.stats().await.unwrap().parked == 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "never parked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 2,000 events of the parked key and 50 of others, in transactions of 100.
    let mut hot = Vec::new();
    let mut all = Vec::new();
    for i in 0..2_000 {
        hot.push((b"hot".to_vec(), format!("{i}").into_bytes()));
        all.push(Event::new("orders", "hot", format!("{i}").into_bytes()));
        if i % 40 == 0 {
            all.push(Event::new("orders", format!("other-{i}"), b"x".to_vec()));
        }
    }
    for chunk in all.chunks(100) {
        let mut tx = store.pool().begin().await.unwrap();
        store.enqueue_batch(&mut tx, chunk.to_vec()).await.unwrap();
        store.commit(tx).await.unwrap();
    }
    until("the other keys", &mut || publisher.published().len() == 50).await;
    let events = store.schema().events_table();
    // The relays mark what was written behind the parked key, within a second or so.
    let start = std::time::Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {events} WHERE dispatched_at IS NULL AND waiting"
        )))
        .fetch_one(store.pool())
        .await
        .unwrap();
        if waiting == 2_000 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the parked key's backlog never waited: {waiting}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.parked, stats.behind_parked),
        (0, 1, 2_000),
        "{stats:?}"
    );
    assert_eq!(store.pending().await.unwrap(), 2_001);
    assert!(!store.has_pending(Duration::from_secs(3600)).await.unwrap());
    // The claim's plan walks the ready index and probes the small ones.
    let plan = explain(&store, store.claim_events_sql(), |query| {
        query.bind(vec![0_i32]).bind(500_i64)
    })
    .await;
    assert!(
        plan.contains("events_ready") && plan.contains("events_waiting"),
        "{plan}"
    );

    // Purged: the backlog goes back to the claim and out, in order.
    let parked = store.parked(10).await.unwrap();
    assert!(store.purge_parked(parked[0].id).await.unwrap());
    until("the backlog", &mut || publisher.published().len() == 2_050).await;
    // Published is not yet committed: the last batch marks its events a moment later.
    let start = std::time::Instant::now();
    while store.pending().await.unwrap() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the backlog's last batch never committed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delivered: Vec<(Vec<u8>, Vec<u8>)> = publisher
        .published()
        .into_iter()
        .filter(|p| p.key == b"hot")
        .map(|p| (p.key, p.payload))
        .collect();
    assert_eq!(crate::support::assert_per_key_order(&hot, &delivered), 0);

    // A waiting event with no failed event ahead of it (as a writer racing the relay's
    // release can leave one) is released within a second or so, and published.
    insert_waiting(&store, "lonely").await;
    assert_eq!(store.pending().await.unwrap(), 1);
    let start = std::time::Instant::now();
    while store.pending().await.unwrap() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the orphan was never released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    token.cancel();
    running.await.unwrap();
    assert_eq!(
        publisher.published().last().map(|p| p.key.clone()),
        Some(b"lonely".to_vec())
    );
}
