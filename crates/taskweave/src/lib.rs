//! Composable async concurrency patterns on tokio.
//!
//! Each pattern is its own crate; this umbrella re-exports each one as a module behind a
//! feature of the same name (all on by default except `outbox`, `governor`, `shutdown-json`
//! and `shutdown-axum`), so `taskweave::supervise::Supervisor`
//! is `taskweave_supervise::Supervisor`. Depend on the single crate you need when you want
//! the smallest build.
//!
//! | module | crate | pattern |
//! |---|---|---|
//! | [`supervise`] | `taskweave-supervise` | panic-capturing spawn, supervisor with drain and restarts |
//! | [`periodic`] | `taskweave-periodic` | periodic jobs without bursts or overlap |
//! | [`pool`] | `taskweave-pool` | batch runner and long-lived worker pool |
//! | [`group`] | `taskweave-group` | errgroup-style task groups, ordered parallel map |
//! | [`semaphore`] | `taskweave-semaphore` | fair, cancellable, resizable semaphore |
//! | [`limit`] | `taskweave-limit` | token bucket, tick and keyed rate limiters |
//! | [`ordone`] | `taskweave-ordone` | a stream that ends when a token is cancelled |
//! | [`fan`] | `taskweave-fan` | fair merge (fan-in) and fan-out |
//! | [`pipeline`] | `taskweave-pipeline` | sources and stages, each on its own task |
//! | [`tee`] | `taskweave-tee` | every value to n outputs, a policy per output |
//! | [`reorder`] | `taskweave-reorder` | reorder buffer, reorder adapter, ordered parallel map |
//! | [`shutdown`] | `taskweave-shutdown` | whole-application graceful shutdown with a report |
//! | `limit` + feature `governor` | `taskweave-limit` | `From<governor::Quota>` for the limiter's `Quota` (off by default) |
//! | `shutdown` + features `shutdown-json`, `shutdown-axum` | `taskweave-shutdown` | `ShutdownReport::to_json`, `Readiness::axum_handler` (off by default) |
//! | `outbox` | `taskweave-outbox` | transactional outbox: PostgreSQL to Kafka, per-key order; the consuming end with a transactional inbox (feature `outbox`, off by default) |
//!
// The example needs `supervise` (a default feature): without it, it is left out.
#![cfg_attr(
    feature = "supervise",
    doc = r#"# Example

```
use taskweave::supervise::spawn;

# #[tokio::main(flavor = "current_thread")]
# async fn main() {
let error = spawn("worker", async { panic!("boom") }).await.unwrap_err();
assert!(error.is_panic());
# }
```"#
)]
// docs.rs builds with `--cfg docsrs` on nightly: mark each feature-gated item.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "supervise")]
#[cfg_attr(docsrs, doc(cfg(feature = "supervise")))]
#[doc(inline)]
pub use taskweave_supervise as supervise;

#[cfg(feature = "periodic")]
#[cfg_attr(docsrs, doc(cfg(feature = "periodic")))]
#[doc(inline)]
pub use taskweave_periodic as periodic;

#[cfg(feature = "pool")]
#[cfg_attr(docsrs, doc(cfg(feature = "pool")))]
#[doc(inline)]
pub use taskweave_pool as pool;

#[cfg(feature = "group")]
#[cfg_attr(docsrs, doc(cfg(feature = "group")))]
#[doc(inline)]
pub use taskweave_group as group;

#[cfg(feature = "semaphore")]
#[cfg_attr(docsrs, doc(cfg(feature = "semaphore")))]
#[doc(inline)]
pub use taskweave_semaphore as semaphore;

#[cfg(feature = "limit")]
#[cfg_attr(docsrs, doc(cfg(feature = "limit")))]
#[doc(inline)]
pub use taskweave_limit as limit;

#[cfg(feature = "ordone")]
#[cfg_attr(docsrs, doc(cfg(feature = "ordone")))]
#[doc(inline)]
pub use taskweave_ordone as ordone;

#[cfg(feature = "fan")]
#[cfg_attr(docsrs, doc(cfg(feature = "fan")))]
#[doc(inline)]
pub use taskweave_fan as fan;

#[cfg(feature = "pipeline")]
#[cfg_attr(docsrs, doc(cfg(feature = "pipeline")))]
#[doc(inline)]
pub use taskweave_pipeline as pipeline;

#[cfg(feature = "tee")]
#[cfg_attr(docsrs, doc(cfg(feature = "tee")))]
#[doc(inline)]
pub use taskweave_tee as tee;

#[cfg(feature = "reorder")]
#[cfg_attr(docsrs, doc(cfg(feature = "reorder")))]
#[doc(inline)]
pub use taskweave_reorder as reorder;

#[cfg(feature = "shutdown")]
#[cfg_attr(docsrs, doc(cfg(feature = "shutdown")))]
#[doc(inline)]
pub use taskweave_shutdown as shutdown;

#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
#[doc(inline)]
pub use taskweave_outbox as outbox;
