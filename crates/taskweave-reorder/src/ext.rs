//! `ReorderExt`: the single-input patterns of this crate as methods on any stream.

use std::future::Future;

use futures::Stream;
use tokio_util::sync::CancellationToken;

use crate::{MapOrdered, Reorder, map_ordered, reorder};

/// [`reorder`] and [`map_ordered`] as methods on any stream.
///
/// # Examples
///
/// ```
/// use futures::StreamExt;
/// use taskweave_reorder::ReorderExt;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let token = CancellationToken::new();
/// let lengths: Vec<usize> = futures::stream::iter(["a", "bb", "ccc"])
///     .map_ordered(token.clone(), 2, |s| async move { s.len() })
///     .map(Result::unwrap)
///     .collect()
///     .await;
/// assert_eq!(lengths, [1, 2, 3]);
///
/// let ordered: Vec<char> = futures::stream::iter([(1, 'b'), (0, 'a')])
///     .reorder(token, 2)
///     .map(Result::unwrap)
///     .collect()
///     .await;
/// assert_eq!(ordered, ['a', 'b']);
/// # }
/// ```
pub trait ReorderExt: Stream + Sized {
    /// [`reorder`] on this stream of `(index, value)` items.
    ///
    /// # Panics
    ///
    /// Panics if `window` is zero.
    fn reorder<T>(self, token: CancellationToken, window: usize) -> Reorder<Self, T>
    where
        Self: Stream<Item = (u64, T)>,
    {
        reorder(token, self, window)
    }

    /// [`map_ordered`] over this stream.
    ///
    /// # Panics
    ///
    /// Panics if `concurrency` is zero, or when called outside a tokio runtime.
    fn map_ordered<F, Fut>(
        self,
        token: CancellationToken,
        concurrency: usize,
        f: F,
    ) -> MapOrdered<Fut::Output>
    where
        Self: Send + 'static,
        Self::Item: Send + 'static,
        F: Fn(Self::Item) -> Fut + Send + Sync + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: Send + 'static,
    {
        map_ordered(token, self, concurrency, f)
    }
}

impl<S: Stream> ReorderExt for S {}
