//! Submitting a batch: `WorkerPool::submit_many` and `try_submit_many`, one lock and one
//! round of wake-ups for as many jobs as fit.

use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;

use super::metrics::Counters;
use super::{Overflow, WorkerPool};
use crate::{Refusal, SubmitManyError};

impl<J, R, E> WorkerPool<J, R, E>
where
    J: Send + 'static,
    R: Send + 'static,
    E: fmt::Display + Send + 'static,
{
    /// Queues the jobs of `jobs`, in order, as many as fit at a time: each round takes the
    /// queue's lock once and wakes at most one worker per job queued. Waits for space when
    /// the queue is full and the policy is [`Overflow::Block`]; returns the indices of the
    /// jobs, which are consecutive (taken when the submission starts).
    ///
    /// The same as calling [`submit`](Self::submit) for each job in turn, at a fraction of
    /// the cost: use it when a producer has several jobs at hand (a page of rows, a batch of
    /// messages). With [`Overflow::Reject`] a full queue refuses the rest of the batch; with
    /// [`Overflow::DropOldest`] the whole batch is accepted and the oldest queued jobs make
    /// room (of a batch larger than the queue, its own first jobs).
    ///
    /// # Errors
    ///
    /// A [`SubmitManyError`] when not every job was accepted: the accepted ones are a prefix
    /// of the batch and stay queued (`accepted`), the rest are handed back in order
    /// (`refused`), and [`Refusal`] says why: `Full` (reject policy), `Closed` (the pool is
    /// closed or its token cancelled), `Cancelled` (`token` was cancelled before the batch or
    /// while it waited for space).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before it completes, the jobs accepted so far stay queued
    /// and the others are dropped with the future (and counted as not accepted). Pass a
    /// token instead to have them handed back.
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_pool::WorkerPool;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let token = CancellationToken::new();
    /// let pool = WorkerPool::new(token.clone(), 2, 4, |_context, row: u32| async move {
    ///     Ok::<_, String>(row)
    /// });
    /// // Ten jobs through a queue of four: the call waits for room as the workers run.
    /// let indices = pool.submit_many(&token, 0..10).await.unwrap();
    /// assert_eq!(indices, 0..10);
    /// assert_eq!(pool.close().await.metrics.completed, 10);
    /// # }
    /// ```
    pub async fn submit_many<I>(
        &self,
        token: &CancellationToken,
        jobs: I,
    ) -> Result<Range<u64>, SubmitManyError<J>>
    where
        I: IntoIterator<Item = J>,
    {
        let shared = &self.handle.shared;
        let own = token == &shared.given || token == shared.cancel.token();
        let mut batch = self.start_batch(jobs);
        if batch.items.is_empty() {
            return Ok(batch.accept_all());
        }
        // A cancellation observed before the batch is taken wins, even with room in the
        // queue (the pool's own tokens close the queue: the queue answers for them).
        if !own && token.is_cancelled() {
            return Err(batch.refuse(Refusal::Cancelled));
        }
        if shared.overflow == Overflow::DropOldest {
            return self.send_evicting(batch);
        }
        loop {
            match shared.queue.try_send_many(&mut batch.items) {
                Ok(sent) => batch.queued(sent),
                Err(()) => return Err(batch.refuse(Refusal::Closed)),
            }
            if batch.items.is_empty() {
                return Ok(batch.accept_all());
            }
            if shared.overflow == Overflow::Reject {
                return Err(batch.refuse(Refusal::Full));
            }
            if !own && token.is_cancelled() {
                return Err(batch.refuse(Refusal::Cancelled));
            }
            // Wait for room for the next job, then queue what fits after it.
            let Some(next) = batch.items.pop_front() else {
                unreachable!("not empty, checked above");
            };
            let (cancelled, unsent) = self.wait_for_room(token, own, next).await;
            match unsent {
                None => batch.queued(1),
                Some(unsent) => {
                    batch.items.push_front(unsent);
                    let reason = if cancelled {
                        Refusal::Cancelled
                    } else {
                        Refusal::Closed
                    };
                    return Err(batch.refuse(reason));
                }
            }
        }
    }

    /// Queues as many jobs of `jobs` as fit now, in order, under one lock of the queue, and
    /// wakes at most one worker per job queued. Never waits. Returns the indices of the jobs
    /// (consecutive) when every one was accepted.
    ///
    /// With [`Overflow::DropOldest`] the whole batch is accepted and the oldest queued jobs
    /// make room (of a batch larger than the queue, its own first jobs).
    ///
    /// # Errors
    ///
    /// A [`SubmitManyError`] with the accepted prefix and the jobs handed back in order:
    /// [`Refusal::Full`] when the queue filled up, [`Refusal::Closed`] when the pool is
    /// closed (then none was accepted).
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_pool::{Refusal, WorkerPool};
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let pool = WorkerPool::new(CancellationToken::new(), 1, 3, |_context, n: u32| async move {
    ///     Ok::<_, String>(n)
    /// });
    /// // A queue of three, no worker has run yet: three are queued, two handed back.
    /// let refused = pool.try_submit_many([10, 11, 12, 13, 14]).unwrap_err();
    /// assert_eq!(refused.accepted, 0..3);
    /// assert_eq!(refused.reason, Refusal::Full);
    /// assert_eq!(refused.refused, [13, 14]);
    /// assert_eq!(pool.close().await.metrics.completed, 3);
    /// # }
    /// ```
    pub fn try_submit_many<I>(&self, jobs: I) -> Result<Range<u64>, SubmitManyError<J>>
    where
        I: IntoIterator<Item = J>,
    {
        let shared = &self.handle.shared;
        let mut batch = self.start_batch(jobs);
        if batch.items.is_empty() {
            return Ok(batch.accept_all());
        }
        if shared.overflow == Overflow::DropOldest {
            return self.send_evicting(batch);
        }
        match shared.queue.try_send_many(&mut batch.items) {
            Ok(sent) => batch.queued(sent),
            Err(()) => return Err(batch.refuse(Refusal::Closed)),
        }
        if batch.items.is_empty() {
            Ok(batch.accept_all())
        } else {
            Err(batch.refuse(Refusal::Full))
        }
    }

    /// Collects the jobs (the iterator is user code: it runs before any index is taken) and
    /// takes one index for each.
    fn start_batch<I: IntoIterator<Item = J>>(&self, jobs: I) -> Batch<'_, J> {
        let jobs: Vec<J> = jobs.into_iter().collect();
        let counters = &self.handle.shared.counters;
        let len = jobs.len() as u64;
        let first = counters.next_index.fetch_add(len, Ordering::Relaxed);
        Batch {
            counters,
            first,
            end: first + len,
            queued: 0,
            items: (first..).zip(jobs).collect(),
            settled: false,
        }
    }

    /// The drop-oldest policy: everything goes in, the oldest come out in the same step.
    fn send_evicting(&self, mut batch: Batch<'_, J>) -> Result<Range<u64>, SubmitManyError<J>> {
        let items = Vec::from(std::mem::take(&mut batch.items));
        match self.handle.shared.queue.try_send_many_evicting(items) {
            Ok(evicted) => {
                batch.queued = batch.end - batch.first;
                let accepted = batch.accept_all();
                // Settled first: a panicking `on_dropped` cannot make an accepted job look
                // refused.
                for job in evicted {
                    self.drop_evicted(Some(job));
                }
                Ok(accepted)
            }
            Err(items) => {
                batch.items = items.into();
                Err(batch.refuse(Refusal::Closed))
            }
        }
    }
}

/// A batch on its way into the queue: the jobs not yet queued are in `items` (front first),
/// `queued` counts those already in. Dropped before it is settled (the `submit_many` future
/// dropped mid-wait), it counts every job not queued (one in a `send` being dropped with it
/// included) as not accepted.
struct Batch<'a, J> {
    counters: &'a Counters,
    first: u64,
    end: u64,
    queued: u64,
    items: VecDeque<(u64, J)>,
    settled: bool,
}

impl<J> Batch<'_, J> {
    /// `sent` more jobs are queued.
    fn queued(&mut self, sent: usize) {
        self.queued += sent as u64;
    }

    /// Every job was accepted.
    fn accept_all(&mut self) -> Range<u64> {
        debug_assert!(self.items.is_empty());
        self.settled = true;
        self.first..self.end
    }

    /// Counts the jobs not queued as not accepted and hands them back.
    fn refuse(&mut self, reason: Refusal) -> SubmitManyError<J> {
        self.settled = true;
        let refused: Vec<J> = std::mem::take(&mut self.items)
            .into_iter()
            .map(|(_, job)| job)
            .collect();
        debug_assert_eq!(self.queued + refused.len() as u64, self.end - self.first);
        let count = refused.len() as u64;
        Counters::add(&self.counters.refused, count);
        if reason != Refusal::Cancelled {
            Counters::add(&self.counters.rejected, count);
        }
        SubmitManyError {
            accepted: self.first..self.first + self.queued,
            refused,
            reason,
        }
    }
}

impl<J> Drop for Batch<'_, J> {
    fn drop(&mut self) {
        if !self.settled {
            let unaccepted = (self.end - self.first).saturating_sub(self.queued);
            Counters::add(&self.counters.refused, unaccepted);
        }
    }
}
