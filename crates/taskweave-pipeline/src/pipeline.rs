//! `Pipeline`: the token and settings that sources and stages are built with, and the
//! sources.

use std::future::{Future, ready};
use std::sync::Arc;

use futures::Stream;
use taskweave_supervise::TaskName;
use tokio_util::sync::CancellationToken;

use crate::Stage;
use crate::run::{spawn_iter_stage, spawn_stage};

/// The output capacity of a stage unless [`Pipeline::with_capacity`] says otherwise.
///
/// 32, the same default as the tee's outputs and the pipeline's stages (one constant in
/// `taskweave-supervise`).
pub const DEFAULT_CAPACITY: usize = taskweave_supervise::internal::DEFAULT_CAPACITY;

/// The largest capacity [`Pipeline::with_capacity`] accepts: 1,048,576 items. A stage's
/// output buffers grow up to its capacity, so a capacity near `usize::MAX` would be an
/// allocation failure (an abort) waiting to happen, not a buffer.
pub const MAX_CAPACITY: usize = 1 << 20;

/// The token and settings that sources and stages are built with; cheap to clone.
///
/// Every source (here) and stage ([`PipelineExt`](crate::PipelineExt)) built with a
/// `Pipeline` spawns one task (through `taskweave-supervise`) that listens to a child of
/// [`token`](Self::token) and owns a bounded output channel of
/// [`capacity`](Self::capacity) items. Cancelling the token stops every one of them; each
/// closes its output on every exit path.
///
/// # Examples
///
/// ```
/// use futures::StreamExt;
/// use taskweave_pipeline::{Pipeline, PipelineExt};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let p = Pipeline::new(CancellationToken::new()).with_capacity(8);
/// let odd_squares: Vec<u64> = p
///     .iter(1..=5_u64)
///     .spawn_map(&p.named("square"), |n| async move { n * n })
///     .spawn_filter(&p.named("odd"), |n| n % 2 == 1)
///     .collect()
///     .await;
/// assert_eq!(odd_squares, [1, 9, 25]);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Pipeline {
    token: CancellationToken,
    capacity: usize,
    name: Option<TaskName>,
}

impl Pipeline {
    /// Sources and stages stopped by `token`, with outputs of [`DEFAULT_CAPACITY`] items.
    #[must_use]
    pub fn new(token: CancellationToken) -> Self {
        Pipeline {
            token,
            capacity: DEFAULT_CAPACITY,
            name: None,
        }
    }

    /// Gives the outputs of the sources and stages built from now on `capacity` items.
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is zero (a stage with no room could never hand an item on) or above
    /// [`MAX_CAPACITY`].
    #[must_use]
    pub fn with_capacity(mut self, capacity: usize) -> Self {
        assert!(
            capacity > 0,
            "Pipeline::with_capacity: capacity must be greater than zero"
        );
        assert!(
            capacity <= MAX_CAPACITY,
            "Pipeline::with_capacity: {capacity} is above MAX_CAPACITY ({MAX_CAPACITY})"
        );
        self.capacity = capacity;
        self
    }

    /// A copy whose sources and stages are named `name` (in logs and in a reported panic)
    /// instead of after their kind (`pipeline-map`, …); typically one name per stage:
    /// `.spawn_map(&p.named("parse"), parse)`.
    #[must_use]
    pub fn named(&self, name: impl Into<TaskName>) -> Self {
        Pipeline {
            name: Some(name.into()),
            ..self.clone()
        }
    }

    /// The token that stops every source and stage built with this `Pipeline`.
    #[must_use]
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// The capacity of each output channel.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn stage_name(&self) -> Option<&TaskName> {
        self.name.as_ref()
    }

    /// A source that sends the items of `items`, in order, then ends.
    ///
    /// The iterator runs on the source's task, one item at a time as the output has room.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures::StreamExt;
    /// use taskweave_pipeline::Pipeline;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let p = Pipeline::new(CancellationToken::new());
    /// assert_eq!(p.iter(["a", "b"]).collect::<Vec<_>>().await, ["a", "b"]);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    pub fn iter<I>(&self, items: I) -> Stage<I::Item>
    where
        I: IntoIterator,
        I::IntoIter: Send + 'static,
        I::Item: Send + 'static,
    {
        spawn_iter_stage(self, "pipeline-iter", items.into_iter(), |item| {
            ready(Some(item))
        })
    }

    /// An endless source that sends `values` in order, over and over, until the token is
    /// cancelled or its output is dropped. Bound it with
    /// [`first`](crate::PipelineExt::first).
    ///
    /// When `values` is empty the output ends at once (rather than never sending anything).
    ///
    /// # Examples
    ///
    /// ```
    /// use futures::StreamExt;
    /// use taskweave_pipeline::{Pipeline, PipelineExt};
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let p = Pipeline::new(CancellationToken::new());
    /// let five: Vec<u8> = p.repeat([1, 2]).first(5).collect().await;
    /// assert_eq!(five, [1, 2, 1, 2, 1]);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    pub fn repeat<I>(&self, values: I) -> Stage<I::Item>
    where
        I: IntoIterator,
        I::Item: Clone + Send + Sync + 'static,
    {
        let values: Arc<[I::Item]> = values.into_iter().collect();
        // Cycling a range of indices clones nothing but the item sent.
        let cycle = (0..values.len()).cycle().map(move |i| values[i].clone());
        spawn_iter_stage(self, "pipeline-repeat", cycle, |item| ready(Some(item)))
    }

    /// A source driven by an async function: `f(state)` returns `Some((item, next_state))`
    /// to send `item` and go on, or `None` to end (like `futures::stream::unfold`).
    ///
    /// # Examples
    ///
    /// ```
    /// use futures::StreamExt;
    /// use taskweave_pipeline::Pipeline;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let p = Pipeline::new(CancellationToken::new());
    /// let pages = p.unfold(1_u32, |page| async move {
    ///     // Fetch page `page`; stop after the third.
    ///     (page <= 3).then(|| (format!("page {page}"), page + 1))
    /// });
    /// assert_eq!(pages.collect::<Vec<_>>().await, ["page 1", "page 2", "page 3"]);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    pub fn unfold<St, F, Fut, T>(&self, init: St, f: F) -> Stage<T>
    where
        St: Send + 'static,
        F: FnMut(St) -> Fut + Send + 'static,
        Fut: Future<Output = Option<(T, St)>> + Send + 'static,
        T: Send + 'static,
    {
        spawn_stage(
            self,
            "pipeline-unfold",
            futures::stream::unfold(init, f),
            |item| ready(Some(item)),
        )
    }

    /// A source that runs any stream on a task of its own, ahead of its consumer (up to
    /// [`capacity`](Self::capacity) items), and stops it on cancellation.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures::StreamExt;
    /// use taskweave_pipeline::Pipeline;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let p = Pipeline::new(CancellationToken::new());
    /// let lines = futures::stream::iter(["GET /", "GET /health"]);
    /// assert_eq!(p.stream(lines).count().await, 2);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    pub fn stream<S>(&self, stream: S) -> Stage<S::Item>
    where
        S: Stream + Send + 'static,
        S::Item: Send + 'static,
    {
        spawn_stage(self, "pipeline-stream", stream, |item| ready(Some(item)))
    }
}
