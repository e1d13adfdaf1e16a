//! Closing: `WorkerPool::close` and `close_within`, and handing back the jobs that never
//! started.

use std::fmt;
use std::time::Duration;

use super::metrics::Counters;
use super::{CloseReport, Shared, WorkerPool, lock};

impl<J, R, E> WorkerPool<J, R, E>
where
    J: Send + 'static,
    R: Send + 'static,
    E: fmt::Display + Send + 'static,
{
    /// Stops intake, lets the queued jobs finish, and resolves when every worker has exited.
    ///
    /// Idempotent: every call waits for the same end; the handed-back jobs (only when the
    /// token was cancelled) go to the first call that collects them.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the pool closed and draining; call again to
    /// wait.
    pub async fn close(&self) -> CloseReport<J> {
        self.stop_intake();
        let shared = &self.handle.shared;
        shared.workers.wait().await;
        self.finish(false)
    }

    /// Like [`close`](Self::close), but when `deadline` passes first, cancels the pool's token
    /// (so running handlers see it and no queued job starts), waits for the running handlers
    /// to return, and hands back every job that never started.
    ///
    /// Handlers are expected to honour their token: one that ignores it delays this call past
    /// the deadline until it returns.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskweave_pool::WorkerPool;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let pool = WorkerPool::new(CancellationToken::new(), 1, 10, |context, _job: u32| async move {
    ///     tokio::select! {
    ///         () = context.cancelled() => Err("interrupted"),
    ///         () = tokio::time::sleep(Duration::from_secs(1)) => Ok(()),
    ///     }
    /// });
    /// for job in 0..5 {
    ///     pool.try_submit(job).unwrap();
    /// }
    /// let report = pool.close_within(Duration::from_millis(2500)).await;
    /// assert!(report.deadline_expired);
    /// assert_eq!(report.metrics.completed, 2); // jobs 0 and 1
    /// assert_eq!(report.interrupted, 1); // job 2 saw its token cancelled
    /// assert_eq!(report.handed_back.iter().map(|(_, job)| *job).collect::<Vec<_>>(), [3, 4]);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Panics if `deadline` is zero.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before the deadline leaves the pool closed and draining, with the
    /// deadline not applied.
    pub async fn close_within(&self, deadline: Duration) -> CloseReport<J> {
        assert!(
            !deadline.is_zero(),
            "WorkerPool::close_within: deadline must be greater than zero"
        );
        self.stop_intake();
        let shared = &self.handle.shared;
        let drained = tokio::time::timeout(deadline, shared.workers.wait()).await;
        if drained.is_ok() {
            return self.finish(false);
        }
        tracing::warn!(pool = %shared.name, ?deadline, in_flight = self.metrics().in_flight, "close deadline passed: cancelling handlers");
        shared.cancel.cancel();
        shared.workers.wait().await;
        self.finish(true)
    }

    fn stop_intake(&self) {
        let shared = &self.handle.shared;
        if shared.close_queue() {
            tracing::debug!(pool = %shared.name, "worker pool closing");
        }
        // A results stream nobody took can never be drained: drop it, so that no worker waits
        // on it (its outcomes are then only counted).
        // Taken out first, so that the stream's drop does not run under this lock.
        let untaken = lock(&shared.results).take();
        drop(untaken);
    }

    /// Hands back what is still queued (only after a cancellation) and reports.
    fn finish(&self, deadline_expired: bool) -> CloseReport<J> {
        let shared = &self.handle.shared;
        let handed_back = shared.take_unstarted();
        Counters::add(&shared.counters.handed_back, handed_back.len() as u64);
        CloseReport {
            handed_back,
            interrupted: shared.counters.interrupted(),
            deadline_expired,
            metrics: self.metrics(),
        }
    }
}

impl<J, R, E> Shared<J, R, E> {
    /// Takes every accepted job that never started: those set aside by workers after a
    /// cancellation and those still queued, sorted by index.
    fn take_unstarted(&self) -> Vec<(u64, J)> {
        let mut unstarted = std::mem::take(&mut *lock(&self.returned));
        unstarted.extend(self.queue.drain());
        unstarted.sort_unstable_by_key(|(index, _)| *index);
        unstarted
    }

    /// After the last handle and the last worker are gone, nobody can hand the unstarted jobs
    /// back: they are counted as dropped and passed to `on_dropped`, never silently lost.
    pub(crate) fn abandon_leftovers(&self) {
        let leftovers = self.take_unstarted();
        if leftovers.is_empty() {
            return;
        }
        Counters::add(&self.counters.dropped, leftovers.len() as u64);
        tracing::warn!(pool = %self.name, jobs = leftovers.len(), "pool dropped after cancellation without close: unstarted jobs dropped");
        for (index, job) in leftovers {
            self.discard(index, job);
        }
    }
}
