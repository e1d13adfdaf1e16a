//! The tee's task: read the input, hand every value to every live output.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;

use futures::{Stream, StreamExt};
use taskweave_supervise::internal::chan::{self, Gone};
use taskweave_supervise::internal::{call_with, drop_caught};
use taskweave_supervise::{PanicError, TaskName, TokenWatch, catch_panic};
use tokio_util::sync::CancellationToken;

use crate::output::{OutputState, Rx, TeeShared};
use crate::{Policy, TeeOutput};

/// Two lockstep outputs ([`Policy::default`]) of every value of `input`; see [`tee_with`].
///
/// # Examples
///
/// ```
/// use futures::StreamExt;
/// use taskweave_tee::tee;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (left, right) = tee(CancellationToken::new(), futures::stream::iter(1..=3));
/// let (left, right) = tokio::join!(left.collect::<Vec<i32>>(), right.collect::<Vec<i32>>());
/// assert_eq!((left, right), (vec![1, 2, 3], vec![1, 2, 3]));
/// # }
/// ```
///
/// # Panics
///
/// Panics when called outside a tokio runtime.
pub fn tee<S>(token: CancellationToken, input: S) -> (TeeOutput<S::Item>, TeeOutput<S::Item>)
where
    S: Stream + Send + 'static,
    S::Item: Clone + Send + 'static,
{
    let mut outputs = tee_with(token, input, [Policy::default(), Policy::default()]);
    let right = outputs.pop().expect("two outputs");
    let left = outputs.pop().expect("two outputs");
    (left, right)
}

/// `n` lockstep outputs ([`Policy::default`]) of every value of `input`; see [`tee_with`].
///
/// # Examples
///
/// ```
/// use futures::StreamExt;
/// use taskweave_tee::tee_n;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let outputs = tee_n(CancellationToken::new(), futures::stream::iter(["x"]), 3);
/// let all = futures::future::join_all(outputs.into_iter().map(|o| o.collect::<Vec<_>>())).await;
/// assert_eq!(all, vec![vec!["x"]; 3]);
/// # }
/// ```
///
/// # Panics
///
/// Panics if `n` is zero or above [`MAX_OUTPUTS`](crate::MAX_OUTPUTS), or when called
/// outside a tokio runtime.
pub fn tee_n<S>(token: CancellationToken, input: S, n: usize) -> Vec<TeeOutput<S::Item>>
where
    S: Stream + Send + 'static,
    S::Item: Clone + Send + 'static,
{
    assert!(n > 0, "tee_n: n must be greater than zero");
    assert!(
        n <= crate::MAX_OUTPUTS,
        "tee_n: {n} outputs is more than MAX_OUTPUTS ({})",
        crate::MAX_OUTPUTS
    );
    tee_with(token, input, vec![Policy::default(); n])
}

/// One output per policy, each receiving every value of `input` in order (`T: Clone`; the
/// last live output gets the original).
///
/// One task (spawned through `taskweave-supervise`) reads the input and hands each value to
/// each live output in turn, as its policy says:
/// - [`Policy::Lockstep`]: waits for room. The task reads the next value only when every
///   lockstep output has taken this one into its buffer, so the slowest lockstep consumer
///   sets the pace (and the other outputs see no new values meanwhile).
/// - [`Policy::DropOldest`]: never waits; a full buffer drops its oldest value, counted in
///   [`TeeOutput::lagged`]. (On a multi-thread runtime, a consumer that takes a value at the
///   same instant can make it drop one value more than strictly needed; every drop is
///   counted.)
/// - [`Policy::Disconnect`]: never waits; a full buffer disconnects the output (it yields
///   what it holds, then ends; [`TeeOutput::is_disconnected`]).
///
/// Each value goes to the outputs that never wait first, then to the lockstep ones. A dropped
/// output is noticed at its next value (or at once, while the task waits on it) and skipped
/// from then on: it never stalls the others. The task stops and every output
/// ends (after its buffered values) when the input ends, when `token` is cancelled, when
/// every output was dropped or disconnected, or when the input or `T::clone` panics (logged,
/// and readable with [`TeeOutput::panic`]).
///
/// **Batches.** After the value it waited for, the task takes whatever more the input has
/// ready at once, as long as every lockstep output has room for it (at most 64 values, and
/// at most 4,096 copies in all unless there are more outputs than that: then one value),
/// copies each value to every output in turn, and hands each
/// lockstep or disconnect output its values under one lock and one wake-up. It never waits
/// for more values to fill a batch, and never waits for room holding more than one value, so
/// what each output receives is what handing on one value at a time would give, and the
/// capacities still count values. A panic of the input or of a clone ends the tee after the
/// values copied before it are handed on. On cancellation the task reads no more values and
/// stops waiting for room; the values it has read go to the outputs that have room for them.
/// The values the tee itself drops (evicted from a drop-oldest output, cut off a disconnected
/// one, or left for an output that is gone) are dropped after every output had its share: a
/// `Drop` that panics there is logged and caught, and the tee goes on.
/// It spends one unit of tokio's cooperative budget per 8 values read, so a tee over an
/// always-ready input lets the other tasks of its thread run after at most 1,024 values.
///
/// # Examples
///
/// ```
/// use futures::StreamExt;
/// use taskweave_tee::{Policy, tee_with};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let policies = [Policy::lockstep(4), Policy::drop_oldest(2)];
/// let mut outputs = tee_with(CancellationToken::new(), futures::stream::iter(0..10), policies);
/// let dashboard = outputs.pop().unwrap();
/// let mut archive = outputs.pop().unwrap();
/// // The archive reads everything; the dashboard reads only at the end.
/// let archived: Vec<i32> = (&mut archive).collect().await;
/// assert_eq!(archived, (0..10).collect::<Vec<_>>());
/// assert_eq!(dashboard.lagged(), 8, "kept only the two newest");
/// assert_eq!(dashboard.collect::<Vec<_>>().await, [8, 9]);
/// # }
/// ```
///
/// # Panics
///
/// Panics if `policies` is empty, holds more than [`MAX_OUTPUTS`](crate::MAX_OUTPUTS), or one
/// has a zero capacity (or one above [`MAX_CAPACITY`](crate::MAX_CAPACITY), for a policy built
/// by hand), or when called outside a tokio
/// runtime.
pub fn tee_with<S, P>(token: CancellationToken, input: S, policies: P) -> Vec<TeeOutput<S::Item>>
where
    S: Stream + Send + 'static,
    S::Item: Clone + Send + 'static,
    P: IntoIterator<Item = Policy>,
{
    // Taken one more than allowed at most: an endless iterator of policies is refused, not
    // collected until memory runs out.
    let policies: Vec<Policy> = policies
        .into_iter()
        .take(crate::MAX_OUTPUTS.saturating_add(1))
        .collect();
    assert!(
        policies.len() <= crate::MAX_OUTPUTS,
        "tee_with: more than MAX_OUTPUTS ({}) outputs",
        crate::MAX_OUTPUTS
    );
    assert!(
        !policies.is_empty(),
        "tee_with: at least one output is needed"
    );
    assert!(
        policies.iter().all(|policy| policy.capacity() > 0),
        "tee: an output's capacity must be greater than zero"
    );
    assert!(
        policies
            .iter()
            .all(|policy| policy.capacity() <= crate::MAX_CAPACITY),
        "tee: an output's capacity is above MAX_CAPACITY ({})",
        crate::MAX_CAPACITY
    );
    let token = token.child_token();
    let shared = Arc::new(TeeShared {
        alive: AtomicUsize::new(policies.len()),
        token: token.clone(),
        panic: OnceLock::new(),
    });
    let mut outputs = Vec::with_capacity(policies.len());
    let mut slots = Vec::with_capacity(policies.len());
    for policy in policies {
        let state = Arc::new(OutputState {
            policy,
            lagged: AtomicU64::new(0),
            disconnected: AtomicBool::new(false),
        });
        let (out, rx) = match policy {
            Policy::DropOldest { capacity } => {
                let (tx, rx) = async_channel::bounded(capacity);
                // Kept by the task to drop the oldest item of a full buffer.
                let evict = rx.clone();
                (Out::Evicting { tx, evict }, Rx::Evicting(Box::pin(rx)))
            }
            _ => {
                let (tx, rx) = chan::bounded(policy.capacity());
                (Out::Batched(Some(tx)), Rx::Batched(rx))
            }
        };
        slots.push(Slot {
            out,
            scratch: VecDeque::new(),
            state: Arc::clone(&state),
        });
        outputs.push(TeeOutput {
            output: rx,
            state,
            shared: Arc::clone(&shared),
            done: false,
        });
    }
    // The outputs that never wait first, so that a full lockstep output does not hold back a
    // drop-oldest or disconnect one; then the lockstep ones, in order. The last one in this
    // order gets the original values.
    slots.sort_by_key(Slot::waits);

    let task_shared = Arc::clone(&shared);
    drop(taskweave_supervise::spawn("tee", async move {
        let watch = TokenWatch::new(&token);
        // A panic is logged (with its backtrace) by `catch_panic`, as the task "tee".
        let panic = match catch_panic("tee", feed(input, &mut slots, &watch)).await {
            Ok(ended) => ended.err(),
            Err(panic) => Some(panic),
        };
        if let Some(panic) = panic {
            let _ = task_shared.panic.set(panic);
        }
        // Dropping the senders (and the evicting receivers) closes every output; what is
        // left for a drop-oldest output that is gone is dropped first, in a catch.
        prune(&mut slots);
        drop(slots);
    }));
    outputs
}

/// The most values the task reads before it hands them on, and the most copies of values
/// (all outputs together) it holds at once: at most `MAX_COPIES / outputs` values, and
/// always one.
const MAX_BATCH: usize = 64;
const MAX_COPIES: usize = 4096;

/// Values read per unit of tokio's cooperative budget, as the pipeline's stages spend it: a
/// task poll reads at most 128 × 8 = 1,024 values.
const VALUES_PER_UNIT: usize = 8;

/// The task's end of one output, and the values waiting to be handed to it.
struct Slot<T> {
    out: Out<T>,
    /// The values of this batch for this output, copied before any is handed on.
    scratch: VecDeque<T>,
    state: Arc<OutputState>,
}

enum Out<T> {
    /// Lockstep and disconnect outputs: a batch goes over under one lock and one wake-up.
    /// `None` once the output is gone (dropped, or disconnected: its sender dropped, which
    /// closes it).
    Batched(Option<chan::Sender<T>>),
    /// Drop-oldest outputs, on async-channel: the batch channel's receiver takes items into a
    /// buffer of its own, from which the task could not drop the oldest one.
    Evicting {
        tx: async_channel::Sender<T>,
        evict: async_channel::Receiver<T>,
    },
}

impl<T> Slot<T> {
    fn waits(&self) -> bool {
        matches!(self.state.policy, Policy::Lockstep { .. })
    }

    fn is_live(&self) -> bool {
        match &self.out {
            Out::Batched(tx) => tx.as_ref().is_some_and(|tx| !tx.receiver_gone()),
            Out::Evicting { tx, .. } => !tx.is_closed(),
        }
    }

    /// The values a lockstep output takes now without waiting.
    fn room(&self) -> Option<usize> {
        match &self.out {
            Out::Batched(Some(tx)) if self.waits() => Some(tx.room()),
            _ => None,
        }
    }

    /// For a drop-oldest output, whose channel the task keeps open: its consumer is gone
    /// when the task's evicting receiver is the only one left. The values its consumer left
    /// in it are dropped here, each in a catch (their `Drop` is user code), rather than with
    /// the channel when the slot goes.
    fn close_if_abandoned(&self) {
        if let Out::Evicting { tx, evict } = &self.out
            && tx.receiver_count() == 1
        {
            tx.close();
            let name = TaskName::from("tee");
            while let Ok(value) = evict.try_recv() {
                drop_caught(&name, value);
            }
        }
    }

    /// Hands this output its values, as its policy says; the values it cannot take go to
    /// `dropped` (dropped by the caller once every output has had its share: their `Drop` is
    /// user code). A lockstep output waits for room only for a batch of one value, and not
    /// once the token is cancelled.
    async fn deliver(&mut self, watch: &TokenWatch, dropped: &mut Vec<T>) {
        let waits = self.waits();
        match &mut self.out {
            Out::Evicting { tx, evict } => {
                for value in self.scratch.drain(..) {
                    offer(tx, evict, &self.state, value, dropped);
                }
            }
            Out::Batched(None) => dropped.extend(self.scratch.drain(..)),
            Out::Batched(Some(tx)) => {
                if self.scratch.is_empty() {
                    return;
                }
                let mut room = tx.room();
                if room < self.scratch.len() && waits {
                    // Only a batch of one value can find no room: a longer one is no longer
                    // than the room every lockstep output had before it was read.
                    room = match watch
                        .run_until_cancelled(poll_fn(|cx| tx.poll_room(cx)))
                        .await
                    {
                        Some(Ok(now)) => now,
                        // Cancelled while waiting: the value is not handed on.
                        None => {
                            dropped.extend(self.scratch.drain(..));
                            return;
                        }
                        Some(Err(Gone)) => 0,
                    };
                }
                if room < self.scratch.len() && !waits {
                    // A disconnect output: what fits goes in, then it is cut off.
                    dropped.extend(self.scratch.drain(room..));
                    let _ = tx.push(&mut self.scratch);
                    // Release pairs with the Acquire in `is_disconnected`.
                    self.state.disconnected.store(true, Ordering::Release);
                    self.out = Out::Batched(None);
                } else if tx.push(&mut self.scratch).is_err() {
                    // Its consumer is gone: the slot is pruned.
                    self.out = Out::Batched(None);
                }
                dropped.extend(self.scratch.drain(..));
            }
        }
    }
}

/// Hands `value` to a drop-oldest output without waiting: a full buffer drops its oldest
/// (into `dropped`).
fn offer<T>(
    tx: &async_channel::Sender<T>,
    evict: &async_channel::Receiver<T>,
    state: &OutputState,
    mut value: T,
    dropped: &mut Vec<T>,
) {
    loop {
        match tx.try_send(value) {
            Ok(()) => return,
            Err(async_channel::TrySendError::Closed(back)) => {
                dropped.push(back);
                return;
            }
            Err(async_channel::TrySendError::Full(back)) => {
                if let Ok(oldest) = evict.try_recv() {
                    dropped.push(oldest);
                    // Relaxed: an independent counter.
                    state.lagged.fetch_add(1, Ordering::Relaxed);
                }
                value = back;
            }
        }
    }
}

/// Drops the outputs that are gone: closed, disconnected, or (drop-oldest) abandoned.
fn prune<T>(slots: &mut Vec<Slot<T>>) {
    for slot in slots.iter() {
        slot.close_if_abandoned();
    }
    slots.retain(Slot::is_live);
}

/// Feeds the outputs until the input ends, the token is cancelled or every output is gone.
/// `Err` carries a panic of the input or of `T::clone`, after the values read before it
/// were handed on.
async fn feed<S>(
    input: S,
    slots: &mut Vec<Slot<S::Item>>,
    watch: &TokenWatch,
) -> Result<(), PanicError>
where
    S: Stream,
    S::Item: Clone,
{
    let mut input = pin!(input);
    let name = TaskName::from("tee");
    let mut dropped = Vec::new();
    loop {
        // The input's `poll_next` and `T::clone` are user code: a panic there ends the tee,
        // but the values copied before it still go out.
        let read = catch_panic(name.clone(), read_batch(input.as_mut(), slots, watch)).await;
        for slot in slots.iter_mut() {
            slot.deliver(watch, &mut dropped).await;
        }
        // After every output had its share: a `Drop` that panics is logged and costs no
        // output a value.
        for value in dropped.drain(..) {
            drop_caught(&name, value);
        }
        // Outputs disconnected or dropped just now: when none is left, stop at once rather
        // than at the next value.
        prune(slots);
        match read {
            Ok(Read::More) if !slots.is_empty() && !watch.is_cancelled() => {}
            // Cancelled, the input ended, or every output is gone.
            Ok(_) => return Ok(()),
            Err(panic) => return Err(panic),
        }
    }
}

enum Read {
    /// The input may have more values.
    More,
    /// The input ended, the token was cancelled, or every output is gone.
    Stop,
}

/// Reads the next value (waiting for it), then as many more as the input has ready, and
/// copies each into every live output's scratch, value by value (the last output takes the
/// original). A panic leaves exactly the values before it, and, in the outputs before the
/// one whose clone panicked, that value too: what handing on one value at a time would have
/// delivered.
async fn read_batch<S>(
    mut input: Pin<&mut S>,
    slots: &mut Vec<Slot<S::Item>>,
    watch: &TokenWatch,
) -> Read
where
    S: Stream,
    S::Item: Clone,
{
    // One unit of tokio's cooperative budget before every `VALUES_PER_UNIT` values
    // (async-channel and the batch channel take none), so that a tee over an always-ready
    // input lets the other tasks of its thread run.
    tokio::task::coop::consume_budget().await;
    let Some(Some(first)) = watch.run_until_cancelled(input.next()).await else {
        return Read::Stop;
    };
    // Outputs dropped while the task waited get no copy.
    prune(slots);
    if slots.is_empty() {
        return Read::Stop;
    }
    // Values past the first are read only while every lockstep output has room for them:
    // the task never waits for room holding more than one value.
    let bound = slots
        .iter()
        .filter_map(Slot::room)
        .fold(MAX_BATCH, usize::min)
        .min(MAX_COPIES / slots.len())
        .max(1);
    copy_out(slots, first);
    for read in 1..bound {
        if read % VALUES_PER_UNIT == 0 {
            tokio::task::coop::consume_budget().await;
        }
        if watch.is_cancelled() {
            return Read::Stop;
        }
        match futures::poll!(input.next()) {
            Poll::Ready(Some(value)) => copy_out(slots, value),
            Poll::Ready(None) => return Read::Stop,
            Poll::Pending => return Read::More,
        }
    }
    Read::More
}

/// Copies `value` into every output's scratch; the last one takes the original.
///
/// A `clone` that panics goes on as the tee's panic, but `value` is dropped first in a catch
/// of its own: dropped while that panic unwinds, a `Drop` that panics too would abort the
/// process.
fn copy_out<T: Clone>(slots: &mut [Slot<T>], value: T) {
    let (last, others) = slots.split_last_mut().expect("live outputs");
    let mut value = value;
    for slot in others {
        let (original, copy) = call_with(&TaskName::from("tee"), value, T::clone);
        slot.scratch.push_back(copy);
        value = original;
    }
    last.scratch.push_back(value);
}
