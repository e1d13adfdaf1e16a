//! Integration tests of taskweave-pipeline, one module per concept.

pub(crate) use taskweave_testkit::{alive_tasks, assert_no_leaked_tasks};
mod auto_traits;
mod batches;
mod exits;
mod seed;
mod stages;
