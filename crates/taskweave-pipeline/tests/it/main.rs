//! Integration tests of taskweave-pipeline, one module per concept.

pub(crate) use taskweave_testkit::{alive_tasks, assert_no_leaked_tasks};
mod exits;
mod seed;
mod stages;

#[test]
fn public_types_are_send_sync_and_unpin() {
    fn send_sync_unpin<T: Send + Sync + Unpin>() {}
    send_sync_unpin::<taskweave_pipeline::Pipeline>();
    send_sync_unpin::<taskweave_pipeline::Stage<u8>>();
    send_sync_unpin::<taskweave_pipeline::StageEnd>();
    send_sync_unpin::<taskweave_pipeline::First<taskweave_pipeline::Stage<u8>>>();
}
