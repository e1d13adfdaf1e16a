//! Integration tests of taskweave-group, one module per concept.

mod auto_traits;
mod collect;
mod group;
mod map;
mod support;
