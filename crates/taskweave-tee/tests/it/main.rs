//! Integration tests of taskweave-tee, one module per concept.

pub(crate) use taskweave_testkit::{alive_tasks, assert_no_leaked_tasks};
mod exits;
mod policies;

#[test]
fn public_types_are_send_sync_and_unpin() {
    fn send_sync_unpin<T: Send + Sync + Unpin>() {}
    send_sync_unpin::<taskweave_tee::TeeOutput<String>>();
    send_sync_unpin::<taskweave_tee::Policy>();
}
