//! `PipelineExt`: stages as methods on any stream.

use std::future::{Future, ready};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use futures::future::Either;
use pin_project_lite::pin_project;
use taskweave_supervise::TaskName;
use taskweave_supervise::internal::call_with;

use crate::run::spawn_stage;
use crate::{First, Pipeline, Stage};

/// Stages as methods on any stream: `p.iter(..).spawn_map(&p, f).spawn_filter(&p, g)`.
///
/// Each `spawn_*` method moves `self` into a new task (spawned through
/// `taskweave-supervise`) that reads it, applies the function, and sends the results into a
/// bounded channel the task owns and closes on every exit path; it returns that output as a
/// [`Stage`]. The input may be any `Stream` (another stage, a futures or tokio-stream
/// adapter, a channel receiver).
///
/// - **Order**: kept; one item at a time per stage (for several at a time, see
///   `taskweave-fan`'s `fan_out` or `taskweave-reorder`'s ordered map).
/// - **Concurrency**: stages run at the same time as each other: while the third stage
///   handles item 1, the first can be producing item 5.
/// - **Panics**: a panic in the function ends the stage with
///   [`StageEnd::Panicked`](crate::StageEnd::Panicked); it is logged with the stage's name
///   (see [`Pipeline::named`]). Every stage downstream that reads it (directly or through
///   adapters) ends with [`StageEnd::UpstreamPanicked`](crate::StageEnd::UpstreamPanicked)
///   carrying it, so the consumer sees the output end early and [`Stage::end`] says why.
/// - **Cancellation**: when the pipeline's token is cancelled each stage drops what it
///   holds (an item, or the function's future) and closes its output; items already in an
///   output are still yielded, then it ends.
///
/// The method names do not clash with `futures::StreamExt` or `tokio_stream::StreamExt`,
/// so all three can be imported together.
pub trait PipelineExt: Stream + Sized {
    /// A stage that sends `f(item).await` for every item.
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
    /// let lengths = futures::stream::iter(["a", "bcd"]).spawn_map(&p, |s| async move { s.len() });
    /// assert_eq!(lengths.collect::<Vec<_>>().await, [1, 3]);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    fn spawn_map<F, Fut>(self, pipeline: &Pipeline, mut f: F) -> Stage<Fut::Output>
    where
        Self: Send + 'static,
        Self::Item: Send,
        F: FnMut(Self::Item) -> Fut + Send + 'static,
        Fut: Future + Send,
        Fut::Output: Send + 'static,
    {
        spawn_stage(pipeline, "pipeline-map", self, move |item| {
            SomeOutput::new(f(item))
        })
    }

    /// A stage that sends on the items for which `keep(&item)` is `true`.
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
    /// let even = p.iter(1..=6).spawn_filter(&p, |n| n % 2 == 0);
    /// assert_eq!(even.collect::<Vec<_>>().await, [2, 4, 6]);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    fn spawn_filter<F>(self, pipeline: &Pipeline, mut keep: F) -> Stage<Self::Item>
    where
        Self: Send + 'static,
        Self::Item: Send + 'static,
        F: FnMut(&Self::Item) -> bool + Send + 'static,
    {
        spawn_stage(pipeline, "pipeline-filter", self, move |item| {
            // A predicate that panics: the item is dropped in a catch, then the panic goes
            // on (the stage's panic).
            let (item, kept) = call_with(&TaskName::from("pipeline-filter"), item, &mut keep);
            ready(kept.then_some(item))
        })
    }

    /// A stage that sends `v` for every item where `f(item).await` is `Some(v)`.
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
    /// let numbers = p
    ///     .iter(["1", "x", "3"])
    ///     .spawn_filter_map(&p, |s| async move { s.parse::<u8>().ok() });
    /// assert_eq!(numbers.collect::<Vec<_>>().await, [1, 3]);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    fn spawn_filter_map<F, Fut, U>(self, pipeline: &Pipeline, f: F) -> Stage<U>
    where
        Self: Send + 'static,
        Self::Item: Send,
        F: FnMut(Self::Item) -> Fut + Send + 'static,
        Fut: Future<Output = Option<U>> + Send,
        U: Send + 'static,
    {
        spawn_stage(pipeline, "pipeline-filter-map", self, f)
    }

    /// A stage over `Result` items: sends `f(v).await` for every `Ok(v)` and passes every
    /// `Err` through untouched, in its place, so an error travels with the data and shows
    /// which element it happened on. The stage itself goes on after an error.
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
    /// let results: Vec<Result<u32, String>> = p
    ///     .iter(["4", "four", "16"])
    ///     .spawn_map(&p, |s| async move { s.parse::<u32>().map_err(|_| format!("not a number: {s}")) })
    ///     .spawn_try_map(&p, |n| async move { Ok(n / 2) })
    ///     .collect()
    ///     .await;
    /// assert_eq!(results, [Ok(2), Err("not a number: four".to_string()), Ok(8)]);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    fn spawn_try_map<T, E, U, F, Fut>(self, pipeline: &Pipeline, mut f: F) -> Stage<Result<U, E>>
    where
        Self: Stream<Item = Result<T, E>> + Send + 'static,
        T: Send,
        E: Send + 'static,
        U: Send + 'static,
        F: FnMut(T) -> Fut + Send + 'static,
        Fut: Future<Output = Result<U, E>> + Send,
    {
        spawn_stage(pipeline, "pipeline-try-map", self, move |item| match item {
            Ok(value) => Either::Left(SomeOutput::new(f(value))),
            Err(error) => Either::Right(ready(Some(Err(error)))),
        })
    }

    /// Go's `take(n)`: the first `n` items, then the end; the input is dropped as soon as
    /// the `n`th item is out (or at once when `n` is zero). When the input is a [`Stage`]
    /// (or owns one), dropping it stops that stage and the stages upstream of it.
    ///
    /// An adapter, not a stage: it needs no task of its own, and so no token. Order and
    /// backpressure are the input's; it is as cancel safe as its input (a `Stage` is).
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
    /// let three: Vec<u32> = p.iter(0..).first(3).collect().await;
    /// assert_eq!(three, [0, 1, 2]);
    /// # }
    /// ```
    fn first(self, n: usize) -> First<Self> {
        First::new(self, n)
    }
}

impl<S: Stream> PipelineExt for S {}

pin_project! {
    /// A step's future with its output wrapped in `Some`. Unlike `FutureExt::map`, it does
    /// not drop the step's future inside `poll` when it completes: the stage drops it after
    /// keeping the output, so a `Drop` of that future that panics (user code) does not take
    /// a finished item with it.
    struct SomeOutput<Fut> {
        #[pin]
        future: Fut,
    }
}

impl<Fut> SomeOutput<Fut> {
    fn new(future: Fut) -> Self {
        SomeOutput { future }
    }
}

impl<Fut: Future> Future for SomeOutput<Fut> {
    type Output = Option<Fut::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().future.poll(cx).map(Some)
    }
}
