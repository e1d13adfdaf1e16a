//! Integration tests of taskweave-outbox, against a real PostgreSQL and a real
//! Kafka-protocol broker (see `support.rs` for how they are found or started).

mod auto_traits;
mod consume;
mod crash;
mod kafka;
mod memory;
mod operations;
mod postgres;
mod shutdown;
mod suite;
mod support;

use taskweave_outbox::MemoryStore;

/// Runs each suite case against the in-memory store (on the paused clock) and against
/// PostgreSQL (on a multi-thread runtime, real time: the server is real).
macro_rules! both_stores {
    ($($case:ident $(($($arg:expr),*))?;)*) => {
        mod on_memory {
            $(
                #[tokio::test(start_paused = true)]
                async fn $case() {
                    crate::suite::$case(crate::suite::Memory(crate::MemoryStore::new(64)) $($(, $arg)*)?).await;
                }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let store = crate::support::fresh_store(64, 12).await;
                    crate::suite::$case(crate::suite::Postgres(store) $($(, $arg)*)?).await;
                }
            )*
        }
    };
}

both_stores! {
    only_committed_events_are_claimed_in_id_order;
    open_batches_claim_disjoint_buckets;
    a_batch_reads_a_prefix_of_each_key;
    relay_publishes_each_event_once_in_key_order;
    a_callers_sequence_is_sent;
    a_failing_key_waits_alone_while_the_others_flow;
    a_failed_acknowledgement_holds_its_key_and_counts_what_got_through;
    a_fatal_publisher_error_stops_the_relay_after_committing_what_went_out;
    drain_waits_for_buckets_another_batch_holds;
    four_relays_share_the_work_and_keep_key_order(10_000, 200);
    cancel_mid_batch_finishes_the_batch_and_starts_no_other;
    a_deadline_too_close_starts_no_batch;
    a_rolling_update_loses_nothing_and_keeps_order;
    a_poison_key_among_fifty_in_one_bucket_waits_alone;
    a_permanent_error_parks_at_once_and_purge_lets_the_key_flow;
    drain_waits_for_a_backoff_but_not_for_a_parked_event;
    retention_deletes_only_dispatched_events_older_than_the_age;
    a_slow_acknowledgement_is_cut_off_and_the_delivered_rest_commits;
    drain_does_not_wait_for_a_retry_due_after_its_deadline;
}

/// Crashes at each point of a batch: nothing lost in any case; duplicates only when the
/// broker acknowledged and the commit never came.
macro_rules! crash_cases {
    ($($name:ident => $point:expr, $duplicates:pat_param,)*) => {
        mod crash_by_abort_on_memory {
            use super::*;
            use taskweave_outbox::hooks::Point;
            $(
                #[tokio::test(start_paused = true)]
                async fn $name() {
                    let duplicates = crate::suite::crash_at(crate::suite::Memory(MemoryStore::new(64)), $point).await;
                    assert!(matches!(duplicates, $duplicates), "{duplicates} duplicates");
                }
            )*
        }
        mod crash_by_abort_on_postgres {
            use taskweave_outbox::hooks::Point;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let store = crate::support::fresh_store(64, 8).await;
                    let duplicates = crate::suite::crash_at(crate::suite::Postgres(store), $point).await;
                    assert!(matches!(duplicates, $duplicates), "{duplicates} duplicates");
                }
            )*
        }
    };
}

crash_cases! {
    before_publishing => Point::BeforePublish, 0,
    after_the_broker_acknowledged => Point::AfterAcks, 1..,
    after_commit => Point::AfterCommit, 0,
}
