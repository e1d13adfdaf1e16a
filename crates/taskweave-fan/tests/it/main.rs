//! Integration tests of taskweave-fan, one module per concept.

pub(crate) use taskweave_testkit::{alive_tasks, assert_no_leaked_tasks};
mod fan_out;
mod merge;

#[test]
fn public_types_are_send_sync_and_unpin() {
    fn send_sync_unpin<T: Send + Sync + Unpin>() {}
    send_sync_unpin::<taskweave_fan::Merge<futures::stream::Iter<std::vec::IntoIter<u8>>>>();
    send_sync_unpin::<taskweave_fan::FanOut<u8>>();
}
