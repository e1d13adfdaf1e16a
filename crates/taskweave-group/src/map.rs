//! Ordered parallel map: `map_parallel` (first failure cancels the rest) and
//! `map_parallel_all` (every outcome, in input order).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use taskweave_supervise::{CatchPanic, PanicError, TokenWatch, catch_panic};
use tokio::task::{Id, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::TaskFailure;
use crate::error::from_caught;
use crate::group::drop_quietly;

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
/// [`TaskFailure::NotStarted`] when `token` was cancelled before every item ran (or before
/// the map read the input's end, for an input whose `size_hint` does not say it has no
/// more: the input is not read further to find out).
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
    // The outcomes a failure discards are dropped in a catch each: their `Drop` is user
    // code, and one that panics must not unwind through the caller in place of the failure.
    if let Some(index) = first_failure
        && let Some(Err(failure)) = slots[index].take()
    {
        slots.into_iter().for_each(drop_quietly);
        return Err(failure);
    }
    let mut values = Vec::with_capacity(slots.len());
    let mut slots = slots.into_iter();
    let failure = loop {
        match slots.next() {
            Some(Some(Ok(value))) => values.push(value),
            Some(Some(Err(failure))) => break failure,
            // The caller's token stopped the map before this item started.
            Some(None) => break TaskFailure::NotStarted,
            None if exhausted => return Ok(values),
            // Every item read ran, but the input may have had more.
            None => break TaskFailure::NotStarted,
        }
    };
    values.into_iter().for_each(drop_quietly);
    slots.for_each(drop_quietly);
    Err(failure)
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
    // Sized from the input's lower bound (capped: a size hint is not trusted with memory, and
    // a map that stops early needs few), so that the slots are not copied over and over as
    // they grow.
    let mut slots: Slots<R, E> = Vec::with_capacity(items.size_hint().0.min(1 << 12));
    let mut calls: JoinSet<(usize, Result<R, TaskFailure<E>>)> = JoinSet::new();
    // The calls run in lanes, at most `limit` of them; each call gets a token of its own,
    // kept in its lane, and the guard cancels the busy lanes' tokens if this future is
    // dropped (the `JoinSet` aborts the calls too). Not one token for the whole map: every
    // clone and drop of a token takes that token's one lock, and with one token shared by
    // every worker thread the map was more than twice as slow as JoinSet + Semaphore on a
    // multi-thread runtime. (A lane's token reused by its next call would save an
    // allocation, but a call that cancels its own token, or keeps it, would then cancel
    // later calls.) A call's task returns its lane, so its item is found without a lookup.
    let mut lanes = Lanes::default();
    // The caller's token, read with one atomic load per round instead of its lock.
    let parent = TokenWatch::new(&token);
    let mut first_failure = None;
    // A token cancelled before the call starts nothing.
    let mut stopped = parent.is_cancelled();
    let mut exhausted = false;
    loop {
        // A cancellation seen before a call starts wins: it starts nothing more.
        if !stopped && parent.is_cancelled() {
            stopped = true;
            lanes.cancel_busy();
        }
        while !stopped && calls.len() < limit {
            let Some((index, item)) = items.next() else {
                exhausted = true;
                break;
            };
            reserve(&mut slots, index);
            let (lane, call_token) = lanes.take();
            let call = Call::Start {
                f: Arc::clone(&f),
                token: call_token,
                item,
            };
            let handle = calls.spawn(InLane {
                lane,
                call: catch_panic("map-call", call),
            });
            lanes.start(lane, handle.id(), index);
        }
        if calls.is_empty() {
            break;
        }
        // The caller's cancellation, when seen, wins over a call that has ended. Its waker is
        // registered only when no call has ended yet.
        let joined = std::future::poll_fn(|cx| {
            if !stopped && parent.is_cancelled() {
                return Poll::Ready(None);
            }
            let joined = calls.poll_join_next(cx);
            if joined.is_pending() && !stopped {
                parent.register(cx.waker());
                if parent.is_cancelled() {
                    return Poll::Ready(None);
                }
            }
            joined.map(Some)
        })
        .await;
        let Some(joined) = joined else {
            stopped = true;
            lanes.cancel_busy();
            continue;
        };
        let Some(joined) = joined else {
            break;
        };
        let (lane, outcome) = match joined {
            Ok((lane, outcome)) => (Some(lane), outcome),
            Err(error) => {
                // The call ended without returning its lane: tokio aborted it (its runtime
                // shutting down; a panic of its future's destructor is caught and logged
                // inside the drop), or a panic escaped the catch (a `tracing` subscriber
                // panicking while the caught panic is logged). Reported against its item rather than leave the item
                // looking unstarted. (A destructor that panics after the call returned is
                // inside the catch: the call comes back `Panicked`, with its lane.)
                let lane = lanes.find(error.id());
                let panic = if error.is_panic() {
                    PanicError::from_panic("map-call", error.into_panic())
                } else {
                    PanicError::from_payload("map-call", &"the call was aborted")
                };
                (lane, Err(TaskFailure::Panicked(panic)))
            }
        };
        let Some(index) = lane.and_then(|lane| lanes.finish(lane)) else {
            continue;
        };
        if outcome.is_err() && stop_on_failure && first_failure.is_none() {
            first_failure = Some(index);
            stopped = true;
            lanes.cancel_busy();
        }
        slots[index] = Some(outcome);
    }
    if !stop_on_failure && !exhausted {
        // Every item gets a slot; the ones read now never started.
        for (index, _item) in items.by_ref() {
            reserve(&mut slots, index);
        }
        exhausted = true;
    }
    // Stopped before reading the input's end: it may still be known to have no more items
    // (a `Vec`, a range). The input is not read further to find out: an item the map would
    // not run would be taken out of it for nothing.
    if !exhausted && items.size_hint().1 == Some(0) {
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

/// The lanes calls run in: the token of the call a busy lane runs, with its task id and item
/// index. A call's task returns its lane, so finding it costs nothing; only a call that
/// ended without returning (aborted, or a panic that escaped its catch) is looked up by task
/// id.
#[derive(Default)]
struct Lanes {
    lanes: Vec<Lane>,
    idle: Vec<usize>,
}

struct Lane {
    token: CancellationToken,
    busy: Option<(Id, usize)>,
}

impl Lanes {
    /// An idle lane (a new one if none is idle) with a new token, and a clone of that token
    /// for the call.
    fn take(&mut self) -> (usize, CancellationToken) {
        let token = CancellationToken::new();
        let call_token = token.clone();
        let lane = match self.idle.pop() {
            Some(lane) => {
                self.lanes[lane].token = token;
                lane
            }
            None => {
                self.lanes.push(Lane { token, busy: None });
                self.lanes.len() - 1
            }
        };
        (lane, call_token)
    }

    fn start(&mut self, lane: usize, id: Id, index: usize) {
        self.lanes[lane].busy = Some((id, index));
    }

    /// Frees `lane`; returns the index of the item its call ran.
    fn finish(&mut self, lane: usize) -> Option<usize> {
        let (_, index) = self.lanes.get_mut(lane)?.busy.take()?;
        self.idle.push(lane);
        Some(index)
    }

    fn find(&self, id: Id) -> Option<usize> {
        self.lanes
            .iter()
            .position(|lane| matches!(lane.busy, Some((busy, _)) if busy == id))
    }

    fn cancel_busy(&self) {
        for lane in &self.lanes {
            if lane.busy.is_some() {
                lane.token.cancel();
            }
        }
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        self.cancel_busy();
    }
}

pin_project! {
    /// A call before and after its first poll: `f` is called there, on the call's task and
    /// inside the `catch_panic`, so a panic in its synchronous part is the call's panic too.
    /// One future whose states share their memory, rather than an `async` block around
    /// another, which reserved room for `f`, the token and the item twice beside `f`'s
    /// future: 104 bytes instead of 168 for the bench's call, about 5 % off the map on the
    /// current-thread runtime (`docs/benchmarks.md`, the 2026-12-02 evening block).
    #[project = CallProj]
    #[project_replace = CallReplace]
    enum Call<F, T, Fut> {
        Start { f: Arc<F>, token: CancellationToken, item: T },
        Running { #[pin] future: Fut },
        Taken,
    }
}

impl<F, T, R, E, Fut> Future for Call<F, T, Fut>
where
    F: Fn(CancellationToken, T) -> Fut,
    Fut: Future<Output = Result<R, E>>,
{
    type Output = Result<R, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let CallProj::Start { .. } = self.as_mut().project() {
            let CallReplace::Start { f, token, item } = self.as_mut().project_replace(Call::Taken)
            else {
                unreachable!("matched just above");
            };
            let future = f(token, item);
            self.set(Call::Running { future });
        }
        match self.project() {
            CallProj::Running { future } => future.poll(cx),
            // `catch_panic` drops a call that panicked and never polls it again.
            CallProj::Start { .. } | CallProj::Taken => unreachable!("polled after its end"),
        }
    }
}

pin_project! {
    /// A call's task: the call, caught, and the lane it runs in, returned with its outcome.
    struct InLane<C> {
        lane: usize,
        #[pin]
        call: CatchPanic<C>,
    }
}

impl<C, R, E> Future for InLane<C>
where
    C: Future<Output = Result<R, E>>,
{
    type Output = (usize, Result<R, TaskFailure<E>>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let outcome = from_caught(std::task::ready!(this.call.poll(cx)));
        Poll::Ready((*this.lane, outcome))
    }
}
