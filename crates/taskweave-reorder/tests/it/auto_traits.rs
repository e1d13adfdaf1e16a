//! Every public type is `Send + Sync + Unpin`, as documented.

#[test]
fn public_types_are_send_sync_and_unpin() {
    fn send_sync_unpin<T: Send + Sync + Unpin>() {}
    type Input = futures::stream::Iter<std::vec::IntoIter<(u64, String)>>;
    send_sync_unpin::<taskweave_reorder::ReorderBuffer<String>>();
    send_sync_unpin::<taskweave_reorder::Reorder<Input, String>>();
    send_sync_unpin::<taskweave_reorder::MapOrdered<String>>();
    send_sync_unpin::<taskweave_reorder::ReorderSender<String>>();
    send_sync_unpin::<taskweave_reorder::ReorderReceiver<String>>();
    send_sync_unpin::<taskweave_reorder::PushError<String>>();
    send_sync_unpin::<taskweave_reorder::ReorderError<String>>();
}
