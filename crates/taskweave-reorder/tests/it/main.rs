//! Integration tests of taskweave-reorder, one module per concept.

pub(crate) use taskweave_testkit::{alive_tasks, assert_no_leaked_tasks};
mod adapter;
mod auto_traits;
mod buffer;
mod channel;
mod map_ordered;
