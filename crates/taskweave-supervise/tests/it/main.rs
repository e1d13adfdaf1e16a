//! Integration tests of taskweave-supervise, one module per concept.

mod auto_traits;
mod catch;
mod restart;
mod spawn;
mod supervisor;
mod support;
mod watch;
