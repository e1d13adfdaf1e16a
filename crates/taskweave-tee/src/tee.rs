//! The tee's task: read the input, hand every value to every live output.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use futures::{Stream, StreamExt};
use taskweave_supervise::{TokenWatch, catch_panic};
use tokio_util::sync::CancellationToken;

use crate::output::{OutputState, TeeShared};
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
        let (tx, rx) = async_channel::bounded(policy.capacity());
        let state = Arc::new(OutputState {
            policy,
            lagged: AtomicU64::new(0),
            disconnected: AtomicBool::new(false),
        });
        slots.push(Slot {
            // Kept by the task to drop the oldest item of a full drop-oldest output.
            evict: matches!(policy, Policy::DropOldest { .. }).then(|| rx.clone()),
            tx,
            state: Arc::clone(&state),
        });
        outputs.push(TeeOutput {
            output: Box::pin(rx),
            state,
            shared: Arc::clone(&shared),
            done: false,
        });
    }

    let task_shared = Arc::clone(&shared);
    drop(taskweave_supervise::spawn("tee", async move {
        let watch = TokenWatch::new(&token);
        // A panic is logged (with its backtrace) by `catch_panic`, as the task "tee".
        if let Err(panic) = catch_panic("tee", feed(input, &mut slots, &watch)).await {
            let _ = task_shared.panic.set(panic);
        }
        // Dropping the senders (and the evicting receivers) closes every output.
        drop(slots);
    }));
    outputs
}

/// The task's end of one output.
struct Slot<T> {
    tx: async_channel::Sender<T>,
    evict: Option<async_channel::Receiver<T>>,
    state: Arc<OutputState>,
}

impl<T> Slot<T> {
    fn waits(&self) -> bool {
        matches!(self.state.policy, Policy::Lockstep { .. })
    }

    fn is_live(&self) -> bool {
        !self.tx.is_closed()
    }

    /// Hands `value` over without waiting (drop-oldest and disconnect outputs).
    fn offer(&self, mut value: T) {
        loop {
            match self.tx.try_send(value) {
                Ok(()) => return,
                Err(async_channel::TrySendError::Closed(_)) => return,
                Err(async_channel::TrySendError::Full(back)) => match &self.evict {
                    Some(evict) => {
                        if evict.try_recv().is_ok() {
                            // Relaxed: an independent counter.
                            self.state.lagged.fetch_add(1, Ordering::Relaxed);
                        }
                        value = back;
                    }
                    None => {
                        // Release pairs with the Acquire in `is_disconnected`.
                        self.state.disconnected.store(true, Ordering::Release);
                        self.tx.close();
                        return;
                    }
                },
            }
        }
    }

    /// For a drop-oldest output, whose channel the task keeps open: its consumer is gone
    /// when the task's evicting receiver is the only one left.
    fn close_if_abandoned(&self) {
        if self.evict.is_some() && self.tx.receiver_count() == 1 {
            self.tx.close();
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

async fn feed<S>(input: S, slots: &mut Vec<Slot<S::Item>>, watch: &TokenWatch)
where
    S: Stream,
    S::Item: Clone,
{
    let mut input = std::pin::pin!(input);
    loop {
        let Some(Some(value)) = watch.run_until_cancelled(input.next()).await else {
            return; // cancelled, or the input ended
        };
        prune(slots);
        let Some(last) = slots.len().checked_sub(1) else {
            return; // every output is gone
        };
        // The outputs that never wait first, so that a full lockstep output does not hold
        // back a drop-oldest or disconnect one; then the lockstep ones, in order.
        let order = slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| !slot.waits())
            .chain(slots.iter().enumerate().filter(|(_, slot)| slot.waits()))
            .map(|(k, _)| k);
        let mut value = Some(value);
        for (n, k) in order.enumerate() {
            let slot = &slots[k];
            let item = if n == last {
                value.take().expect("moved into the last output only")
            } else {
                value.as_ref().expect("still here").clone()
            };
            if slot.waits() {
                // An error means its consumer is gone: it is dropped below.
                if watch
                    .run_until_cancelled(slot.tx.send(item))
                    .await
                    .is_none()
                {
                    return;
                }
            } else {
                slot.offer(item);
            }
        }
        // Outputs disconnected or dropped just now: when none is left, stop at once rather
        // than at the next value.
        prune(slots);
        if slots.is_empty() {
            return;
        }
        // One unit of tokio's cooperative budget per value (async-channel takes none), so
        // that a tee over an always-ready input with non-waiting outputs lets others run.
        tokio::task::coop::consume_budget().await;
    }
}
