//! Integration tests of taskweave-periodic, one module per concept.

mod auto_traits;
mod isolation;
mod schedule;
mod stop;
