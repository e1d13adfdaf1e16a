//! Named points inside a batch, for crash tests (`test-hooks` feature).

/// Where a batch is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Point {
    /// Claimed, nothing sent yet.
    BeforePublish,
    /// Every acknowledgement is in; not committed yet.
    AfterAcks,
    /// Committed (or the commit failed).
    AfterCommit,
}

#[cfg(feature = "test-hooks")]
pub(crate) type Hook =
    std::sync::Arc<dyn Fn(Point) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;
