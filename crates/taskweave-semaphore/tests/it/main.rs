//! Integration tests of taskweave-semaphore, one module per concept.

mod acquire;
mod auto_traits;
mod bound;
mod fairness;
mod resize;
