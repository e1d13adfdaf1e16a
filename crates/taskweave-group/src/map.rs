//! Ordered parallel map: `map_parallel` (first failure cancels the rest) and
//! `map_parallel_all` (every outcome, in input order).

use std::future::Future;
use std::sync::Arc;

use taskweave_supervise::{PanicError, catch_panic};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::TaskFailure;

/// Applies `f` to every item with at most `limit` calls in flight, each on its own task, and
/// returns the results **in input order**; the first failure cancels the rest.
///
/// Each call gets a token of its own, cancelled by the first failure (by time, as the results
/// come in) or when `token` is cancelled. After a failure no new call starts; the ones in flight
/// see their token and are awaited, and their outcomes are discarded. A panicking call is
/// caught and becomes [`TaskFailure::Panicked`].
///
/// Unlike `futures::StreamExt::buffered(n)`, the calls run on their own tasks: they progress
/// even while the caller is busy, and use more than one core on a multi-thread runtime.
///
/// # Examples
///
/// ```
/// use taskweave_group::map_parallel;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let lengths = map_parallel(CancellationToken::new(), ["a", "bb", "ccc"], 2, |_token, word| async move {
///     Ok::<_, String>(word.len())
/// })
/// .await
/// .unwrap();
/// assert_eq!(lengths, [1, 2, 3]);
/// # }
/// ```
///
/// # Errors
///
/// The first failure, as a [`TaskFailure`].
///
/// # Panics
///
/// Panics if `limit` is zero, or when called outside a tokio runtime.
///
/// # Cancel safety
///
/// Dropping the returned future cancels the calls' token and aborts the calls.
pub async fn map_parallel<I, T, R, E, F, Fut>(
    token: CancellationToken,
    items: I,
    limit: usize,
    f: F,
) -> Result<Vec<R>, TaskFailure<E>>
where
    I: IntoIterator<Item = T>,
    T: Send + 'static,
    R: Send + 'static,
    E: Send + 'static,
    F: Fn(CancellationToken, T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, E>> + Send + 'static,
{
    let (mut slots, first_failure) = run_ordered(token, items, limit, f, true).await;
    if let Some(index) = first_failure
        && let Some(Err(failure)) = slots[index].take()
    {
        return Err(failure);
    }
    let mut values = Vec::with_capacity(slots.len());
    for slot in slots {
        match slot {
            Some(Ok(value)) => values.push(value),
            Some(Err(failure)) => return Err(failure),
            // Only when the caller's token stopped the map before this item started.
            None => return Err(TaskFailure::NotStarted),
        }
    }
    Ok(values)
}

/// Like [`map_parallel`], but runs every item to the end and returns every outcome in input
/// order: a failure does not cancel the others.
///
/// # Examples
///
/// ```
/// use taskweave_group::map_parallel_all;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let outcomes = map_parallel_all(CancellationToken::new(), [1, 2, 3], 2, |_token, n: u32| async move {
///     if n == 2 { Err("two") } else { Ok(n * 10) }
/// })
/// .await;
/// assert_eq!(outcomes[0].as_ref().unwrap(), &10);
/// assert!(outcomes[1].is_err());
/// assert_eq!(outcomes[2].as_ref().unwrap(), &30);
/// # }
/// ```
///
/// # Panics
///
/// Panics if `limit` is zero, or when called outside a tokio runtime.
///
/// # Cancel safety
///
/// Dropping the returned future cancels the calls' token and aborts the calls. Cancelling
/// `token` instead lets the calls in flight finish; the items that never started are
/// reported as [`TaskFailure::NotStarted`].
pub async fn map_parallel_all<I, T, R, E, F, Fut>(
    token: CancellationToken,
    items: I,
    limit: usize,
    f: F,
) -> Vec<Result<R, TaskFailure<E>>>
where
    I: IntoIterator<Item = T>,
    T: Send + 'static,
    R: Send + 'static,
    E: Send + 'static,
    F: Fn(CancellationToken, T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, E>> + Send + 'static,
{
    let (slots, _) = run_ordered(token, items, limit, f, false).await;
    slots
        .into_iter()
        .map(|slot| slot.unwrap_or(Err(TaskFailure::NotStarted)))
        .collect()
}

/// One slot per item, in input order: `None` for an item that never ran.
type Slots<R, E> = Vec<Option<Result<R, TaskFailure<E>>>>;

/// The engine of both maps: at most `limit` calls in flight on a `JoinSet`, outcomes stored
/// by index. With `stop_on_failure`, the first failure (in completion order) cancels the
/// calls in flight and no new call starts; its index is returned. Cancelling `token` does the
/// same (the items that never started stay `None`).
async fn run_ordered<I, T, R, E, F, Fut>(
    token: CancellationToken,
    items: I,
    limit: usize,
    f: F,
    stop_on_failure: bool,
) -> (Slots<R, E>, Option<usize>)
where
    I: IntoIterator<Item = T>,
    T: Send + 'static,
    R: Send + 'static,
    E: Send + 'static,
    F: Fn(CancellationToken, T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, E>> + Send + 'static,
{
    assert!(limit > 0, "map_parallel: limit must be greater than zero");
    let f = Arc::new(f);
    let mut items = items.into_iter().enumerate();
    let mut slots: Slots<R, E> = Vec::new();
    let mut calls: JoinSet<(usize, Result<R, TaskFailure<E>>)> = JoinSet::new();
    // Each call gets a token of its own, cancelled by this loop, rather than a clone of one
    // shared token: every clone and drop of a shared token takes that token's one lock, from
    // every worker thread, which made the map more than twice as slow as JoinSet + Semaphore
    // on a multi-thread runtime. The guard cancels the calls in flight if this future is
    // dropped (the `JoinSet` aborts them too).
    let mut in_flight = InFlight(Vec::with_capacity(limit));
    let mut parent_cancelled = std::pin::pin!(token.cancelled());
    let mut first_failure = None;
    let mut stopped = false;
    loop {
        while !stopped && calls.len() < limit {
            let Some((index, item)) = items.next() else {
                break;
            };
            reserve(&mut slots, index);
            let f = Arc::clone(&f);
            let call_token = CancellationToken::new();
            in_flight.0.push((index, call_token.clone()));
            calls.spawn(async move {
                let outcome =
                    catch_panic("map-call", async move { f(call_token, item).await }).await;
                let outcome = match outcome {
                    Ok(Ok(value)) => Ok(value),
                    Ok(Err(error)) => Err(TaskFailure::Failed(error)),
                    Err(panic) => Err(TaskFailure::Panicked(panic)),
                };
                (index, outcome)
            });
        }
        if calls.is_empty() {
            break;
        }
        let joined = tokio::select! {
            biased;
            () = &mut parent_cancelled, if !stopped => {
                stopped = true;
                in_flight.cancel_all();
                continue;
            }
            joined = calls.join_next() => joined,
        };
        let Some(joined) = joined else {
            break;
        };
        let (index, outcome) = match joined {
            Ok(done) => done,
            Err(error) if error.is_panic() => {
                // A panicking destructor of the call's future: its index is unknown.
                let panic = PanicError::from_payload("map-call", error.into_panic().as_ref());
                tracing::error!(%panic, "map_parallel: a call's destructor panicked");
                continue;
            }
            Err(_aborted) => continue,
        };
        in_flight.finished(index);
        if outcome.is_err() && stop_on_failure && first_failure.is_none() {
            first_failure = Some(index);
            stopped = true;
            in_flight.cancel_all();
        }
        slots[index] = Some(outcome);
    }
    // Items never read from the iterator count too.
    for (index, _item) in items {
        reserve(&mut slots, index);
    }
    (slots, first_failure)
}

/// Makes room for the outcome of item `index`.
fn reserve<R, E>(slots: &mut Slots<R, E>, index: usize) {
    if slots.len() <= index {
        slots.resize_with(index + 1, || None);
    }
}

/// The tokens of the calls in flight (at most `limit`), by item index.
struct InFlight(Vec<(usize, CancellationToken)>);

impl InFlight {
    fn finished(&mut self, index: usize) {
        if let Some(position) = self.0.iter().position(|(call, _)| *call == index) {
            self.0.swap_remove(position);
        }
    }

    fn cancel_all(&self) {
        for (_, token) in &self.0 {
            token.cancel();
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.cancel_all();
    }
}
