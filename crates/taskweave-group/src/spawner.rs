//! `Spawner`: a cloneable handle that spawns into a `TaskGroup`, for its tasks to spawn siblings.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::SpawnError;
use crate::group::Inner;

/// A handle that spawns into a [`TaskGroup`](crate::TaskGroup), to move into its tasks; from
/// [`TaskGroup::spawner`](crate::TaskGroup::spawner).
///
/// It spawns exactly as the group does (the same limit, the same refusals). Once the group
/// has been waited for or dropped, every spawn is refused with [`SpawnError::Cancelled`].
///
/// A task that waits in [`spawn`](Self::spawn) for a slot holds its own slot meanwhile: when
/// every running task does that, none can go on (as with Go's `errgroup.Go` under
/// `SetLimit`). Inside tasks, prefer [`try_spawn`](Self::try_spawn) or leave headroom.
///
/// # Examples
///
/// A crawl where each page spawns its links:
///
/// ```
/// use std::future::Future;
/// use std::pin::Pin;
/// use taskweave_group::{Spawner, TaskGroup};
/// use tokio_util::sync::CancellationToken;
///
/// type Visit = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
///
/// fn visit(spawner: Spawner<String>, depth: u32) -> Visit {
///     Box::pin(async move {
///         if depth > 0 {
///             for _link in 0..2 {
///                 let child = visit(spawner.clone(), depth - 1);
///                 spawner.spawn(child).await.map_err(|refused| refused.to_string())?;
///             }
///         }
///         Ok(())
///     })
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let group = TaskGroup::new(CancellationToken::new());
/// group.spawn(visit(group.spawner(), 3)).await.unwrap();
/// group.wait().await.unwrap(); // 1 + 2 + 4 + 8 pages, all waited for
/// # }
/// ```
pub struct Spawner<E> {
    inner: Arc<Inner<E>>,
}

impl<E> Spawner<E> {
    pub(crate) fn new(inner: Arc<Inner<E>>) -> Self {
        Spawner { inner }
    }
}

impl<E: Send + 'static> Spawner<E> {
    /// Spawns `future` into the group, first waiting for a free slot when a limit is set.
    ///
    /// # Errors
    ///
    /// The future is handed back: [`SpawnError::Cancelled`] when the group's token is
    /// cancelled (before or while waiting) or the group was waited for or dropped.
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the returned future is dropped while waiting for a slot, nothing was
    /// spawned.
    pub async fn spawn<F>(&self, future: F) -> Result<(), SpawnError<F>>
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        self.inner.spawn(future).await
    }

    /// Spawns `future` into the group only if a slot is free now.
    ///
    /// # Errors
    ///
    /// The future is handed back: [`SpawnError::Full`] when every slot is taken,
    /// [`SpawnError::Cancelled`] when the group's token is cancelled or the group is gone.
    ///
    /// # Panics
    ///
    /// Panics when called outside a tokio runtime.
    pub fn try_spawn<F>(&self, future: F) -> Result<(), SpawnError<F>>
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        self.inner.try_spawn(future)
    }

    /// The group's token.
    #[must_use]
    pub fn token(&self) -> CancellationToken {
        self.inner.token.clone()
    }
}

impl<E> Clone for Spawner<E> {
    fn clone(&self) -> Self {
        Spawner {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<E> fmt::Debug for Spawner<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Spawner")
            .field("cancelled", &self.inner.token.is_cancelled())
            .finish_non_exhaustive()
    }
}
