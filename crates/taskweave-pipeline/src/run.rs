//! The task of a source or stage: it takes whatever its input has ready, runs its function
//! on each item and hands the results on in one push.
//!
//! **Opportunistic batching.** Each turn of the loop asks the output for room, then takes,
//! one at a time, up to that many items that the input has *ready now* (never waiting to fill
//! a batch), runs the step on each as it is taken and pushes the results under one lock and
//! one wake-up. So:
//! - one item at a time still goes straight through (a batch of one, no waiting for more);
//! - everything the stage holds, the item in its step included, has a place in its output,
//!   so the capacity still bounds the items between two stages;
//! - a step that has to wait (an async call that is pending) first hands on what is done,
//!   and an item finished while the reader is parked waiting for one is handed on at once
//!   (with any finished before it). So a step that runs long without ever waiting holds
//!   back only the items finished before it in the same turn while the reader was busy;
//! - one unit of tokio's cooperative budget per up to [`ITEMS_PER_UNIT`] items of a turn, so
//!   a stage whose input is always ready still gives way to its thread's other tasks, after
//!   starting at most 1,024 items (tokio's budget of 128 units; tokio's own `recv_many`
//!   spends one unit per call, however many items it takes);
//! - the token is checked before every item, while a step waits and before a waiting step
//!   is polled again, so a cancel stops the stage within one item, and a cancel seen first
//!   wins over a step that became ready in the same instant (its output is never made). The results already computed are pushed before the stage ends
//!   (on a cancel and after a panic too): an item the stage finished is never lost. Items
//!   taken from the input but not started are dropped, as items still queued in the input
//!   are when a cancelled stage drops it.
//!
//! When the input is a [`Stage`] itself (the usual chain), the items are popped straight out
//! of its channel's buffer (`Stage::poll_pop`: no lock per item, only when the buffer is
//! refilled, and no move through a buffer of the stage's own). When it needs an item, the stage reserves as many as are ready and fit in
//! what is left of the turn's room, and gives back their room in the input in one
//! read-modify-write: a turn of 32 items usually pays one, where a consumer's `poll_next`
//! pays one per item. From then on they count against the stage's own output. The input's
//! type is recognised with a `TypeId` comparison (`Any`), which is all stable Rust offers in
//! place of specialisation. A source over an iterator ([`Pipeline::iter`],
//! [`Pipeline::repeat`]) calls `next` directly, with none of a stream's machinery per item.
//!
//! [`Pipeline::iter`]: crate::Pipeline::iter
//! [`Pipeline::repeat`]: crate::Pipeline::repeat

use std::any::Any;
use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use pin_project_lite::pin_project;
use taskweave_supervise::{PanicError, TaskName, TokenWatch, catch_panic};

use crate::stage::{Listening, Shared, StageEnd, heard_panic};
use crate::{Pipeline, Stage};
use taskweave_supervise::internal::chan::{self, Gone};

/// The most items one turn of a stage's loop moves: bounds the results a stage holds
/// before it pushes them.
const MAX_BATCH: usize = 256;
/// Items per unit of tokio's cooperative budget. Against one unit per item (the first
/// batching version: a thread-local read and write per item, and a yield every 128 items),
/// one per 8 takes 0.76–0.96 × the time of the three-stage bench at outputs of 32 and
/// 0.59–0.84 × at 1,024 (`docs/benchmarks.md`, pipeline section), and bounds a stage's run
/// between two yields at 1,024 items.
const ITEMS_PER_UNIT: usize = 8;

/// How the loop of a stage stopped.
enum Stop {
    InputEnded(Option<PanicError>),
    Cancelled,
    ConsumerGone,
}

/// Spawns the task of one source or stage: it reads `input`, runs `step` on each item and
/// sends the `Some` results into a bounded channel it owns.
pub(crate) fn spawn_stage<S, F, Fut, O>(
    pipeline: &Pipeline,
    default_name: &'static str,
    input: S,
    step: F,
) -> Stage<O>
where
    S: Stream + Send + 'static,
    S::Item: Send,
    F: FnMut(S::Item) -> Fut + Send + 'static,
    Fut: Future<Output = Option<O>> + Send,
    O: Send + 'static,
{
    let mut input = Some(input);
    let any: &mut dyn Any = &mut input;
    if let Some(upstream) = any.downcast_mut::<Option<Stage<S::Item>>>() {
        let upstream = upstream.take().expect("the input is there");
        spawn_input_stage(pipeline, default_name, StageInput(upstream), step)
    } else {
        let input = AnyInput {
            input: input.take().expect("the input is there"),
            caught: None,
            ended: false,
        };
        spawn_input_stage(pipeline, default_name, input, step)
    }
}

/// [`spawn_stage`] for a source that reads an iterator: its items are taken with `next`, with
/// none of a stream's machinery around each one.
pub(crate) fn spawn_iter_stage<It, F, Fut, O>(
    pipeline: &Pipeline,
    default_name: &'static str,
    items: It,
    step: F,
) -> Stage<O>
where
    It: Iterator + Send + 'static,
    It::Item: Send,
    F: FnMut(It::Item) -> Fut + Send + 'static,
    Fut: Future<Output = Option<O>> + Send,
    O: Send + 'static,
{
    let input = IterInput {
        items,
        ended: false,
    };
    spawn_input_stage(pipeline, default_name, input, step)
}

fn spawn_input_stage<I, F, Fut, O>(
    pipeline: &Pipeline,
    default_name: &'static str,
    input: I,
    step: F,
) -> Stage<O>
where
    I: Input + Send + 'static,
    I::Item: Send,
    F: FnMut(I::Item) -> Fut + Send + 'static,
    Fut: Future<Output = Option<O>> + Send,
    O: Send + 'static,
{
    let name = pipeline
        .stage_name()
        .cloned()
        .unwrap_or_else(|| TaskName::from(default_name));
    let token = pipeline.token().child_token();
    let (tx, rx) = chan::bounded(pipeline.capacity());
    let stage = Stage::new(rx, name.clone(), token.clone());
    let shared = stage.shared();
    let watch = TokenWatch::new(&token);
    let task_name = shared.name.clone();
    let task = async move {
        stage_task(name, input, step, tx, watch, shared).await;
    };
    drop(taskweave_supervise::spawn(task_name, task));
    stage
}

async fn stage_task<I, F, Fut, O>(
    name: TaskName,
    input: I,
    step: F,
    tx: chan::Sender<O>,
    watch: TokenWatch,
    shared: Arc<Shared>,
) where
    I: Input,
    F: FnMut(I::Item) -> Fut,
    Fut: Future<Output = Option<O>>,
{
    // The results not yet pushed live out here, so that a panic in the step (caught below)
    // does not take the ones already computed with it. The input and the items taken from it
    // live out here too: dropped during a step's unwind, a `Drop` of theirs that panics
    // (user code) would be a panic inside a panic, an abort. They are dropped below instead,
    // in a catch of their own.
    let mut done = VecDeque::new();
    let mut next = None;
    let mut input = Box::pin(input);
    // The step and its call in flight (user values as well) live out here for the same
    // reason.
    let mut step = step;
    let mut call = pin!(None::<Fut>);
    let looped = catch_panic(
        name.clone(),
        run_loop(
            input.as_mut(),
            &mut step,
            call.as_mut(),
            &tx,
            &watch,
            &mut done,
            &mut next,
        ),
    )
    .await;
    let mut end = match looped {
        Err(panic) => StageEnd::Panicked(panic),
        Ok(Stop::InputEnded(Some(panic))) => {
            tracing::debug!(stage = %name, upstream = %panic.name(), "stage ended: a stage upstream panicked");
            StageEnd::UpstreamPanicked(panic)
        }
        Ok(Stop::InputEnded(None)) => StageEnd::InputEnded,
        Ok(Stop::Cancelled | Stop::ConsumerGone) => StageEnd::Cancelled,
    };
    // They fit: the loop took no more items than the output had room for. When the
    // consumer is gone they are dropped, and their `Drop` (user code) may panic.
    let _ = catch_drops(&name, "results", || {
        let _ = tx.push(&mut done);
        drop(done);
    });
    // Before the end is recorded: a panic here is the stage's panic, unless it already had one.
    let dropped = catch_drops(&name, "input and step", || {
        call.set(None);
        drop(step);
        drop(next);
        drop(input);
    });
    if let (Some(panic), None) = (dropped, end.panic()) {
        end = StageEnd::Panicked(panic);
    }
    tracing::debug!(stage = %name, ?end, "stage finished");
    let _ = shared.end.set(end);
    // Closes the output after `end` is set.
    drop(tx);
}

/// Runs `drop_them` (drops of user values, whose `Drop` may panic) and catches a panic:
/// logged with the stage's name, and returned.
fn catch_drops(name: &TaskName, what: &str, drop_them: impl FnOnce()) -> Option<PanicError> {
    let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(drop_them)).err()?;
    let panic = PanicError::from_panic(name.clone(), payload);
    tracing::error!(stage = %name, panic = %panic.message(), "dropping a stage's {what} panicked: caught");
    Some(panic)
}

async fn run_loop<I, F, Fut, O>(
    mut input: Pin<&mut I>,
    step: &mut F,
    // The call of `step` in flight, kept across polls when it waits.
    mut call: Pin<&mut Option<Fut>>,
    tx: &chan::Sender<O>,
    watch: &TokenWatch,
    done: &mut VecDeque<O>,
    next: &mut Option<I::Item>,
) -> Stop
where
    I: Input,
    F: FnMut(I::Item) -> Fut,
    Fut: Future<Output = Option<O>>,
{
    loop {
        // Items left on the unit of budget spent last. It starts at zero at every point where
        // the task may have returned `Pending` (here, before the turn's awaits, and where a
        // step waits), so every item is paid for in the task poll that starts it: a poll
        // starts at most 128 × `ITEMS_PER_UNIT` items (and may finish one call started in
        // the poll before). A turn of n items spends ceil(n / 8) units.
        let mut unit_left = 0_usize;
        let room = match watch
            .run_until_cancelled(poll_fn(|cx| tx.poll_room(cx)))
            .await
        {
            None => return Stop::Cancelled,
            Some(Err(Gone)) => return Stop::ConsumerGone,
            Some(Ok(room)) => room.min(MAX_BATCH),
        };
        // Wait for the first item of the turn.
        let first = watch
            .run_until_cancelled(poll_fn(|cx| input.as_mut().poll_item(cx, room)))
            .await;
        match first {
            None => return Stop::Cancelled,
            Some(None) => return Stop::InputEnded(input.as_mut().caught()),
            Some(Some(item)) => *next = Some(item),
        }
        // Items the turn may still start: everything the stage holds has a place in its
        // output.
        let mut left = room;
        // The items of the turn, in one poll loop (no await point per item).
        let turn = poll_fn(|cx| {
            // A call in flight here waited in an earlier poll. A cancel seen before it is
            // polled again wins over the call, even one that became ready in the same
            // instant: its future is dropped and its output never made.
            let polled = if call.is_some() && watch.is_cancelled() {
                Poll::Ready(Turn::Cancelled)
            } else {
                'turn: loop {
                    if let Some(running) = call.as_mut().as_pin_mut() {
                        match running.poll(cx) {
                            Poll::Ready(output) => {
                                let finished = output.is_some();
                                // Kept before the future is dropped: a `Drop` of it that panics
                                // (user code) does not take the finished item with it.
                                if let Some(output) = output {
                                    done.push_back(output);
                                }
                                call.set(None);
                                // A reader waiting for items gets this one now, not at the end
                                // of the turn.
                                if finished && tx.receiver_parked() {
                                    let _ = tx.push(done);
                                }
                            }
                            Poll::Pending => {
                                // The call waits: hand on what is done first, so that it does not
                                // wait behind a slow item. A consumer gone is seen at the next
                                // push.
                                let _ = tx.push(done);
                                unit_left = 0;
                                watch.register(cx.waker());
                                if watch.is_cancelled() {
                                    break 'turn Poll::Ready(Turn::Cancelled);
                                }
                                break 'turn Poll::Pending;
                            }
                        }
                    }
                    if watch.is_cancelled() {
                        break 'turn Poll::Ready(Turn::Cancelled);
                    }
                    if left == 0 {
                        break 'turn Poll::Ready(Turn::Over);
                    }
                    // One unit of tokio's cooperative budget per `ITEMS_PER_UNIT` items (the
                    // channel takes none): a stage whose input is always ready and whose output
                    // always has room (a filter that keeps few items, a consumer on another
                    // thread) still lets the other tasks of its thread run. Out of budget, it
                    // hands on what is done and yields; the turn goes on at the next poll.
                    if unit_left == 0 {
                        let Poll::Ready(budget) = tokio::task::coop::poll_proceed(cx) else {
                            let _ = tx.push(done);
                            break 'turn Poll::Pending;
                        };
                        budget.made_progress();
                        unit_left = ITEMS_PER_UNIT;
                    }
                    // The turn's first item, or the next one that is ready now (never waited
                    // for). An input hands over one item a call, so the items it gave before a
                    // panic in it are already done.
                    let item = match next.take() {
                        Some(item) => item,
                        None => match input.as_mut().poll_item(cx, left) {
                            Poll::Ready(Some(item)) => item,
                            Poll::Ready(None) => break 'turn Poll::Ready(Turn::InputEnded),
                            Poll::Pending => break 'turn Poll::Ready(Turn::Over),
                        },
                    };
                    unit_left -= 1;
                    left -= 1;
                    call.set(Some(step(item)));
                }
            };
            // At the end of every poll of the turn, whatever the task does next: a sender
            // upstream that a large reservation found waiting is woken now
            // (`chan::DEFER_WAKE_ABOVE`).
            input.as_mut().settle();
            polled
        })
        .await;
        let pushed = tx.push(done);
        match turn {
            Turn::Cancelled => return Stop::Cancelled,
            Turn::InputEnded => return Stop::InputEnded(input.as_mut().caught()),
            Turn::Over if pushed.is_err() => return Stop::ConsumerGone,
            Turn::Over => {}
        }
    }
}

/// How one turn of a stage's loop ended.
enum Turn {
    /// The room was used up, or the input had nothing more ready.
    Over,
    InputEnded,
    Cancelled,
}

/// What a stage reads: a [`Stage`], an iterator, or any other stream.
trait Input {
    type Item;

    /// The next item, when the stage may take up to `max` (at least one) before its turn
    /// ends. `Ready(None)`: the input ended; `Pending`: none yet (the task will be woken).
    fn poll_item(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        max: usize,
    ) -> Poll<Option<Self::Item>>;

    /// Wakes what a large reservation owes a wake-up; called before every return of the
    /// stage's task poll.
    fn settle(self: Pin<&mut Self>) {}

    /// After the input ended: the panic upstream that ended it, if one did.
    fn caught(self: Pin<&mut Self>) -> Option<PanicError>;
}

/// A [`Stage`] read directly: items popped from its channel's buffer with no lock, their
/// room given back for up to `max` at once.
struct StageInput<T>(Stage<T>);

impl<T> Input for StageInput<T> {
    type Item = T;

    #[inline]
    fn poll_item(self: Pin<&mut Self>, cx: &mut Context<'_>, max: usize) -> Poll<Option<T>> {
        // `Stage` is `Unpin`.
        self.get_mut().0.poll_pop(cx, max)
    }

    #[inline]
    fn settle(self: Pin<&mut Self>) {
        self.get_mut().0.settle();
    }

    fn caught(self: Pin<&mut Self>) -> Option<PanicError> {
        self.0.end().and_then(StageEnd::panic).cloned()
    }
}

/// An iterator, read with `next` until it returns `None` (it is not called again: it need
/// not be fused). It is dropped with the input, in the stage's catch for the input's drop.
struct IterInput<It> {
    items: It,
    ended: bool,
}

// The iterator is never pinned.
impl<It> Unpin for IterInput<It> {}

impl<It: Iterator> Input for IterInput<It> {
    type Item = It::Item;

    #[inline]
    fn poll_item(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        _max: usize,
    ) -> Poll<Option<It::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let item = this.items.next();
        this.ended = item.is_none();
        Poll::Ready(item)
    }

    fn caught(self: Pin<&mut Self>) -> Option<PanicError> {
        None
    }
}

pin_project! {
    // Any other stream, polled with `LISTEN` set: a `Stage` inside it (in an adapter such as
    // `map` or `chain`) that ended because of a panic leaves the panic in `caught`.
    struct AnyInput<S> {
        #[pin]
        input: S,
        caught: Option<PanicError>,
        ended: bool,
    }
}

impl<S: Stream> Input for AnyInput<S> {
    type Item = S::Item;

    fn poll_item(self: Pin<&mut Self>, cx: &mut Context<'_>, _max: usize) -> Poll<Option<S::Item>> {
        let this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        let listening = Listening::start();
        let polled = this.input.poll_next(cx);
        if let Some(panic) = heard_panic() {
            this.caught.get_or_insert(panic);
        }
        drop(listening);
        if let Poll::Ready(None) = polled {
            // A stream that ended is not polled again (it need not be fused).
            *this.ended = true;
        }
        polled
    }

    fn caught(self: Pin<&mut Self>) -> Option<PanicError> {
        self.project().caught.take()
    }
}
