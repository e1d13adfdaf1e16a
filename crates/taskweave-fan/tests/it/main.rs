//! Integration tests of taskweave-fan, one module per concept.

mod fan_out;
mod merge;

/// The number of tasks alive on the current runtime.
pub(crate) fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Asserts that the runtime is back to `baseline` alive tasks.
pub(crate) async fn assert_no_leaked_tasks(baseline: usize) {
    for _ in 0..32 {
        if alive_tasks() == baseline {
            return;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(alive_tasks(), baseline, "tasks leaked");
}

#[test]
fn public_types_are_send_sync_and_unpin() {
    fn send_sync_unpin<T: Send + Sync + Unpin>() {}
    send_sync_unpin::<taskweave_fan::Merge<futures::stream::Iter<std::vec::IntoIter<u8>>>>();
    send_sync_unpin::<taskweave_fan::FanOut<u8>>();
}
