//! Every public type is `Send + Sync + Unpin`, as documented.

#[test]
fn public_types_are_send_sync_and_unpin() {
    fn send_sync_unpin<T: Send + Sync + Unpin>() {}
    send_sync_unpin::<taskweave_tee::TeeOutput<String>>();
    send_sync_unpin::<taskweave_tee::Policy>();
}
