//! Integration tests of taskweave-semaphore, one module per concept.

mod acquire;
mod auto_traits;
mod fairness;
mod resize;
