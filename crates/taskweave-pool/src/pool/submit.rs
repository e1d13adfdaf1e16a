//! Submitting: `WorkerPool::submit` and `try_submit`, and how a job is accepted or refused.

use std::fmt;
use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;

use super::metrics::Counters;
use super::{Overflow, WorkerPool};
use crate::queue::TrySendError;
use crate::{SubmitError, TrySubmitError};

impl<J, R, E> WorkerPool<J, R, E>
where
    J: Send + 'static,
    R: Send + 'static,
    E: fmt::Display + Send + 'static,
{
    /// Queues `job`, waiting for space when the queue is full and the policy is
    /// [`Overflow::Block`]. Returns the job's index, taken when the submission starts (a
    /// refused submission leaves a gap; blocked submitters are not served in index order).
    ///
    /// With [`Overflow::Reject`] a full queue refuses at once; with [`Overflow::DropOldest`]
    /// the oldest queued job makes room.
    ///
    /// # Errors
    ///
    /// The job is handed back in every case: [`SubmitError::Full`] (reject policy),
    /// [`SubmitError::Closed`] (the pool is closed or its token cancelled, also while
    /// waiting), [`SubmitError::Cancelled`] (`token` was cancelled while waiting for space).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in the sense that matters: if the future is dropped before it completes,
    /// the job was not queued (it is dropped with the future) and the submission is counted
    /// as not accepted. To keep the job on cancellation, pass the token instead:
    /// `Cancelled(job)` hands it back.
    ///
    /// # Cost of the token
    ///
    /// Waiting on the token the pool was started with (or a clone of it), or on
    /// [`token`](Self::token), costs nothing extra: their cancellation closes the queue, which
    /// ends the wait. Any other token, a child of those included, is watched beside the wait
    /// (a registration on the token for each wait that finds the queue full), and checked
    /// before anything else: a cancelled one gives `Cancelled` even with room in the queue
    /// (one lock of the token per submit). The pool's own tokens close the queue inside
    /// `cancel()`, so a submit that starts after their `cancel()` has returned gets `Closed`.
    /// The close lands when tokio-util wakes the token's waiters, just after it has marked
    /// the token cancelled: a submit on another thread that sees `is_cancelled()` while that
    /// `cancel()` is still running may still be accepted (then run, or handed back by
    /// `close_within`, like any accepted job). Pass a child token where that window matters.
    pub async fn submit(&self, token: &CancellationToken, job: J) -> Result<u64, SubmitError<J>> {
        let shared = &self.handle.shared;
        let own = token == &shared.given || token == shared.cancel.token();
        let index = shared.counters.next_index.fetch_add(1, Ordering::Relaxed);
        // A cancellation observed before the job is taken wins, even with room in the queue.
        // The pool's own tokens need no check: their cancellation closes the queue inside
        // `cancel()`, so the queue answers `Closed` for them.
        if !own && token.is_cancelled() {
            Counters::add(&shared.counters.refused, 1);
            return Err(SubmitError::Cancelled(job));
        }
        // Counts the submission as refused if this future is dropped before it resolves (or a
        // drop callback unwinds through it): the job was then never accepted.
        let mut unresolved = Unresolved::new(&shared.counters);
        let (index, job) = match self.enqueue((index, job)) {
            Ok(evicted) => {
                unresolved.disarm();
                self.drop_evicted(evicted);
                return Ok(index);
            }
            Err(Refused::Full(item)) if shared.overflow == Overflow::Block => item,
            Err(refused) => {
                unresolved.disarm();
                return Err(self.refuse(refused).into());
            }
        };
        // Slow path: wait for room.
        let (cancelled, unsent) = self.wait_for_room(token, own, (index, job)).await;
        unresolved.disarm();
        let Some((index, job)) = unsent else {
            return Ok(index);
        };
        if cancelled {
            Counters::add(&shared.counters.refused, 1);
            return Err(SubmitError::Cancelled(job));
        }
        Err(self.refuse(Refused::Closed((index, job))).into())
    }

    /// Waits for room for `item` (`own`: `token` is one of the pool's own tokens). Returns
    /// whether the caller's token was cancelled, and the item when it was not queued.
    ///
    /// The send keeps the item until it is queued, so however the wait ends, the item is
    /// either in the queue or back in our hands. Cancelling one of the pool's own tokens
    /// closes the queue (the pool's hook), which ends the send: no registration on the token,
    /// the common case (a service passes its token to the pool and to its submits) and the
    /// cheap one. Any other token is watched beside the send.
    pub(super) async fn wait_for_room(
        &self,
        token: &CancellationToken,
        own: bool,
        item: (u64, J),
    ) -> (bool, Option<(u64, J)>) {
        let mut send = self.handle.shared.queue.send(item);
        if own {
            return match (&mut send).await {
                Ok(()) => (false, None),
                Err(unsent) => (token.is_cancelled(), Some(unsent)),
            };
        }
        let sent = tokio::select! {
            biased;
            () = token.cancelled() => None,
            sent = &mut send => Some(sent),
        };
        match sent {
            Some(Ok(())) => (false, None),
            Some(Err(unsent)) => (false, Some(unsent)),
            None => (true, send.into_item()),
        }
    }

    /// Queues `job` if that is possible without waiting. Returns the job's index.
    ///
    /// With [`Overflow::DropOldest`] a full queue drops its oldest job instead of refusing.
    ///
    /// # Errors
    ///
    /// [`TrySubmitError::Full`] with the job when the queue is full, or
    /// [`TrySubmitError::Closed`] when the pool is closed.
    pub fn try_submit(&self, job: J) -> Result<u64, TrySubmitError<J>> {
        let counters = &self.handle.shared.counters;
        let index = counters.next_index.fetch_add(1, Ordering::Relaxed);
        let mut unresolved = Unresolved::new(counters);
        match self.enqueue((index, job)) {
            Ok(evicted) => {
                unresolved.disarm();
                self.drop_evicted(evicted);
                Ok(index)
            }
            Err(refused) => {
                unresolved.disarm();
                Err(self.refuse(refused))
            }
        }
    }

    /// Counts a submission that was not accepted and turns it into the error for the caller.
    fn refuse(&self, refused: Refused<J>) -> TrySubmitError<J> {
        let counters = &self.handle.shared.counters;
        Counters::add(&counters.refused, 1);
        Counters::add(&counters.rejected, 1);
        match refused {
            Refused::Full((_, job)) => TrySubmitError::Full(job),
            Refused::Closed((_, job)) => TrySubmitError::Closed(job),
        }
    }

    /// One attempt to queue, applying the drop-oldest policy.
    /// On success returns the job evicted to make room (drop-oldest); the caller settles its
    /// own accounting first, then calls [`drop_evicted`](Self::drop_evicted), so that a
    /// panicking `on_dropped` callback cannot make an accepted job look refused.
    fn enqueue(&self, item: (u64, J)) -> Result<Option<(u64, J)>, Refused<J>> {
        let shared = &self.handle.shared;
        if shared.overflow == Overflow::DropOldest {
            // The oldest job comes out and the new one goes in under the queue's lock: a close
            // finds every accepted job either queued or evicted (then dropped, never both).
            return shared
                .queue
                .try_send_evicting(item)
                .map_err(Refused::Closed);
        }
        match shared.queue.try_send(item) {
            Ok(()) => Ok(None),
            Err(TrySendError::Full(item)) => Err(Refused::Full(item)),
            Err(TrySendError::Closed(item)) => Err(Refused::Closed(item)),
        }
    }

    /// Counts an evicted job as dropped and hands it to `on_dropped`.
    pub(super) fn drop_evicted(&self, evicted: Option<(u64, J)>) {
        let Some((index, job)) = evicted else {
            return;
        };
        let shared = &self.handle.shared;
        Counters::add(&shared.counters.dropped, 1);
        tracing::debug!(pool = %shared.name, job = index, "queue full: oldest job dropped");
        shared.discard(index, job);
    }
}

/// Counts a submission as refused unless disarmed: see `submit`.
struct Unresolved<'a> {
    counters: &'a Counters,
    armed: bool,
}

impl<'a> Unresolved<'a> {
    fn new(counters: &'a Counters) -> Self {
        Unresolved {
            counters,
            armed: true,
        }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Unresolved<'_> {
    fn drop(&mut self) {
        if self.armed {
            Counters::add(&self.counters.refused, 1);
        }
    }
}

enum Refused<J> {
    Full((u64, J)),
    Closed((u64, J)),
}
