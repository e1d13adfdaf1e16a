//! Integration tests of taskweave-pool, one module per concept.

mod accounting;
mod auto_traits;
mod batch;
mod close;
mod panics;
mod results;
mod resume_at;
mod submit;
mod submit_many;
mod support;
