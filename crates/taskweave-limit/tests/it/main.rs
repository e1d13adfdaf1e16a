//! Integration tests of taskweave-limit, one module per concept.

mod auto_traits;
mod keyed;
mod rate;
mod stream;
mod tick;
