//! Ordered parallel map: `map_parallel` (first failure cancels the rest) and
//! `map_parallel_all` (every outcome, in input order).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use taskweave_supervise::{PanicError, catch_panic};
use tokio::task::{Id, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::TaskFailure;

/// Applies `f` to every item with at most `limit` calls in flight, each on its own task, and
/// returns the results **in input order**; the first failure cancels the rest.
///
/// Each call gets a token of its own, cancelled by the first failure (by time, as the results
/// come in) or when `token` is cancelled. After that no new call starts; the calls in flight
/// see their token cancelled and are awaited, and their outcomes are discarded. A panicking
/// call is caught and becomes [`TaskFailure::Panicked`]. The input is read lazily, one item
/// per started call, and not read any further once the map stops.
///
/// Unlike `futures::StreamExt::buffered(n)`, the calls run on their own tasks: they progress
/// even while the caller is busy, and use more than one core on a multi-thread runtime.
///
/// The error is a [`TaskFailure<E>`] rather than `E`, so that a panic and a cancellation are
/// reported too.
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
/// The first failure ([`TaskFailure::Failed`] or [`TaskFailure::Panicked`]), or
/// [`TaskFailure::NotStarted`] when `token` was cancelled before every item ran.
///
/// # Panics
///
/// Panics if `limit` is zero, or when called outside a tokio runtime.
///
/// # Cancel safety
///
/// Dropping the returned future cancels the calls' tokens and aborts the calls.
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
    let Run {
        mut slots,
        first_failure,
        exhausted,
    } = run_ordered(token, items, limit, f, true).await;
    if let Some(index) = first_failure
        && let Some(Err(failure)) = slots[index].take()
    {
        return Err(failure);
    }
    if !exhausted {
        return Err(TaskFailure::NotStarted);
    }
    let mut values = Vec::with_capacity(slots.len());
    for slot in slots {
        match slot {
            Some(Ok(value)) => values.push(value),
            Some(Err(failure)) => return Err(failure),
            // The caller's token stopped the map before this item started.
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
/// Dropping the returned future cancels the calls' tokens and aborts the calls. Cancelling
/// `token` instead cancels the calls' tokens and waits for the calls in flight to return
/// (their outcomes are kept); the items that never started are reported as
/// [`TaskFailure::NotStarted`]. The whole input is read, to report every item.
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
    run_ordered(token, items, limit, f, false)
        .await
        .slots
        .into_iter()
        .map(|slot| slot.unwrap_or(Err(TaskFailure::NotStarted)))
        .collect()
}

/// One slot per item read, in input order: `None` for an item that never ran.
type Slots<R, E> = Vec<Option<Result<R, TaskFailure<E>>>>;

struct Run<R, E> {
    slots: Slots<R, E>,
    /// The index of the failure that stopped the map (first by completion).
    first_failure: Option<usize>,
    /// `true` when every item of the input was read.
    exhausted: bool,
}

/// The engine of both maps: at most `limit` calls in flight on a `JoinSet`, outcomes stored
/// by index. With `stop_on_failure`, the first failure (in completion order) cancels the calls
/// in flight and no new call starts. Cancelling `token` does the same. Without
/// `stop_on_failure` the rest of the input is read once the map stops, so that every item
/// has a slot.
async fn run_ordered<I, T, R, E, F, Fut>(
    token: CancellationToken,
    items: I,
    limit: usize,
    f: F,
    stop_on_failure: bool,
) -> Run<R, E>
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
    let mut calls: JoinSet<Result<R, TaskFailure<E>>> = JoinSet::new();
    // Each call gets a token of its own, cancelled by this loop, rather than a clone of one
    // shared token: every clone and drop of a shared token takes that token's one lock, from
    // every worker thread, which made the map more than twice as slow as JoinSet + Semaphore
    // on a multi-thread runtime. The guard cancels the calls in flight if this future is
    // dropped (the `JoinSet` aborts them too).
    let mut in_flight = InFlight(HashMap::new());
    let mut parent_cancelled = std::pin::pin!(token.cancelled());
    let mut first_failure = None;
    // A token cancelled before the call starts nothing.
    let mut stopped = token.is_cancelled();
    let mut exhausted = false;
    loop {
        while !stopped && calls.len() < limit {
            let Some((index, item)) = items.next() else {
                exhausted = true;
                break;
            };
            reserve(&mut slots, index);
            let f = Arc::clone(&f);
            let call_token = CancellationToken::new();
            let cancel = call_token.clone();
            let handle = calls.spawn(async move {
                match catch_panic("map-call", async move { f(call_token, item).await }).await {
                    Ok(Ok(value)) => Ok(value),
                    Ok(Err(error)) => Err(TaskFailure::Failed(error)),
                    Err(panic) => Err(TaskFailure::Panicked(panic)),
                }
            });
            in_flight.0.insert(handle.id(), (index, cancel));
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
            joined = calls.join_next_with_id() => joined,
        };
        let Some(joined) = joined else {
            break;
        };
        let (id, outcome) = match joined {
            Ok((id, outcome)) => (id, outcome),
            Err(error) => {
                let id = error.id();
                // The call's future panicked in its destructor (or was aborted): report it
                // against its item rather than leave the item looking unstarted.
                let panic = if error.is_panic() {
                    PanicError::from_panic("map-call", error.into_panic())
                } else {
                    PanicError::from_payload("map-call", &"the call was aborted")
                };
                (id, Err(TaskFailure::Panicked(panic)))
            }
        };
        let Some((index, _)) = in_flight.0.remove(&id) else {
            continue;
        };
        if outcome.is_err() && stop_on_failure && first_failure.is_none() {
            first_failure = Some(index);
            stopped = true;
            in_flight.cancel_all();
        }
        slots[index] = Some(outcome);
    }
    if !stop_on_failure && !exhausted {
        // Every item gets a slot; the ones read now never started.
        for (index, _item) in items {
            reserve(&mut slots, index);
        }
        exhausted = true;
    }
    Run {
        slots,
        first_failure,
        exhausted,
    }
}

/// Makes room for the outcome of item `index`.
fn reserve<R, E>(slots: &mut Slots<R, E>, index: usize) {
    if slots.len() <= index {
        slots.resize_with(index + 1, || None);
    }
}

/// The calls in flight (at most `limit`): their item index and token, by task id.
struct InFlight(HashMap<Id, (usize, CancellationToken)>);

impl InFlight {
    fn cancel_all(&self) {
        for (_, token) in self.0.values() {
            token.cancel();
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.cancel_all();
    }
}
