//! Every public type is `Send + Sync + Unpin`, as documented.

#[test]
fn public_types_are_send_sync_and_unpin() {
    fn send_sync_unpin<T: Send + Sync + Unpin>() {}
    send_sync_unpin::<taskweave_shutdown::Shutdown>();
    send_sync_unpin::<taskweave_shutdown::Readiness>();
    send_sync_unpin::<taskweave_shutdown::PhaseContext>();
    send_sync_unpin::<taskweave_shutdown::CriticalSection>();
    send_sync_unpin::<taskweave_shutdown::ShutdownReport>();
}
