//! Public types are `Send + Sync + Unpin` when their contents are.

use std::future::Ready;

use taskweave_group::{CollectGroup, CollectReport, SpawnError, Spawner, TaskFailure, TaskGroup};

fn send_sync_unpin<T: Send + Sync + Unpin>() {}

#[test]
fn public_types_are_send_sync_and_unpin() {
    send_sync_unpin::<TaskGroup<String>>();
    send_sync_unpin::<Spawner<String>>();
    send_sync_unpin::<CollectGroup<u32, String>>();
    send_sync_unpin::<CollectReport<u32, String>>();
    send_sync_unpin::<TaskFailure<String>>();
    send_sync_unpin::<SpawnError<Ready<Result<(), String>>>>();
    let boxed: Box<dyn std::error::Error + Send + Sync> =
        Box::new(TaskFailure::Failed("db down".to_owned()));
    assert_eq!(boxed.to_string(), "db down");
}
