//! Public types are `Send + Sync + Unpin` when their contents are.

use taskweave_pool::{
    BatchReport, CloseReport, JobContext, JobError, Overflow, PoolMetrics, Results, SubmitError,
    TrySubmitError, WorkerPool, WorkerPoolBuilder,
};

fn send_sync_unpin<T: Send + Sync + Unpin>() {}

#[test]
fn public_types_are_send_sync_and_unpin() {
    send_sync_unpin::<WorkerPool<String, u64, String>>();
    send_sync_unpin::<WorkerPoolBuilder<String>>();
    send_sync_unpin::<Results<u64, String>>();
    send_sync_unpin::<CloseReport<String>>();
    send_sync_unpin::<BatchReport<String, u64, String>>();
    send_sync_unpin::<PoolMetrics>();
    send_sync_unpin::<Overflow>();
    send_sync_unpin::<SubmitError<String>>();
    send_sync_unpin::<TrySubmitError<String>>();
    send_sync_unpin::<JobError<String>>();
    send_sync_unpin::<JobContext>();
    // The stream is `Sync` when outcomes are only `Send`, and `Unpin` whatever they are.
    send_sync_unpin::<Results<std::cell::Cell<u64>, String>>();
    send_sync_unpin::<Results<std::marker::PhantomPinned, String>>();
}

#[test]
fn errors_work_as_boxed_errors() {
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(SubmitError::Full(3_u8));
    assert_eq!(boxed.to_string(), "queue full");
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(TrySubmitError::Closed(3_u8));
    assert_eq!(boxed.to_string(), "pool closed");
}
