//! Every public type is `Send + Sync + Unpin`, as documented.

#[test]
fn public_types_are_send_sync_and_unpin() {
    fn send_sync_unpin<T: Send + Sync + Unpin>() {}
    send_sync_unpin::<taskweave_pipeline::Pipeline>();
    send_sync_unpin::<taskweave_pipeline::Stage<u8>>();
    send_sync_unpin::<taskweave_pipeline::StageEnd>();
    send_sync_unpin::<taskweave_pipeline::First<taskweave_pipeline::Stage<u8>>>();
    // `Sync` whenever the item is `Send`, also for items that are not `Sync` or `Unpin`.
    send_sync_unpin::<taskweave_pipeline::Stage<std::cell::Cell<u32>>>();
    send_sync_unpin::<taskweave_pipeline::Stage<std::marker::PhantomPinned>>();
}
