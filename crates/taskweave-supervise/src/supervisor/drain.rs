//! The drain: `Supervisor::wait`, and `Supervisor::shutdown` with its deadline and report.

use std::time::Duration;

use tokio::task::{AbortHandle, Id};
use tokio::time::Instant;

use super::{DrainLog, Supervisor};
use crate::DrainReport;

impl Supervisor {
    /// Waits until the supervisor is closed and every task has ended. Waits forever if nobody
    /// closes it. Unlike [`shutdown`](Self::shutdown), it has no deadline and cancels nothing.
    /// Called from one of the supervisor's own tasks, it waits for all the others.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskweave_supervise::Supervisor;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let supervisor = Supervisor::new(CancellationToken::new());
    /// supervisor.spawn("flush", tokio::time::sleep(Duration::from_millis(30))).unwrap();
    /// supervisor.close();
    /// supervisor.wait().await;
    /// assert!(supervisor.is_empty());
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future has no effect on the supervisor.
    pub async fn wait(&self) {
        self.wait_drained(tokio::task::try_id()).await;
    }

    async fn wait_drained(&self, except: Option<Id>) {
        loop {
            let notified = self.shared.drained.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a drain that completes right after the check
            // still wakes this waiter.
            notified.as_mut().enable();
            // Drained: nothing will be spawned, so the retired handles' tasks are freed now.
            let retired = {
                let mut state = self.state();
                state
                    .is_drained(except)
                    .then(|| std::mem::take(&mut state.retired))
            };
            if let Some(retired) = retired {
                drop(retired);
                return;
            }
            notified.await;
        }
    }

    /// Waits for the drain until `deadline` (`None`: a grace too long to be represented, no
    /// deadline); true if it completed in time.
    ///
    /// A drain of tasks that stop as soon as they are cancelled usually ends within the
    /// scheduling round of the cancellation, so the deadline's timer is registered only after
    /// one yield. Registering a timer that is due before the earliest one the runtime's driver
    /// recorded when it last parked (or when it recorded none) wakes the driver: with the IO
    /// driver enabled, an eventfd write, and the next `epoll_wait` returns at once
    /// (`docs/benchmarks.md`, supervise section, measures what that cost a drain of one
    /// task). The `Sleep` is still created up front, so a runtime without its time driver
    /// panics at once, as `tokio::time::sleep_until` documents, not only when a drain is slow.
    /// The deadline was fixed by the caller before the yield, so registering late does not
    /// lengthen it.
    async fn drained_by(&self, me: Option<Id>, deadline: Option<Instant>) -> bool {
        let expiry = deadline.map(tokio::time::sleep_until);
        let wait = self.wait_drained(me);
        let mut wait = std::pin::pin!(wait);
        tokio::select! {
            biased;
            () = &mut wait => return true,
            () = tokio::task::yield_now() => {}
        }
        match expiry {
            // The wait first, as `tokio::time::timeout` does: a drain that completes as the
            // deadline passes counts as in time.
            Some(expiry) => tokio::select! {
                biased;
                () = &mut wait => true,
                () = expiry => false,
            },
            None => {
                wait.await;
                true
            }
        }
    }

    /// Closes the supervisor, cancels its token, waits up to `grace` for the tasks to end, then
    /// aborts the rest and reports.
    ///
    /// The report names every task that ended during this call: finished, failed (a
    /// restarting task that ended with an error), panicked, or aborted (by the deadline or by
    /// its handle). Aborted tasks are awaited until their futures are dropped, which takes one
    /// scheduling round; a task stuck in blocking code cannot be dropped, so that second wait
    /// is bounded by `grace` too and such tasks are named as `unresponsive`. The call returns
    /// within `2 × grace` at most, after about `grace` when something had to be aborted.
    ///
    /// Overlapping calls each report the tasks that ended during their own call. Called from
    /// one of the supervisor's own tasks (a control task that decides to stop everything), it
    /// drains and reports all the others and leaves the caller running.
    ///
    /// # Examples
    ///
    /// See the [type-level example](Self).
    ///
    /// # Panics
    ///
    /// Panics if `grace` is zero: a drain needs time; to abort at once, pass the smallest
    /// grace that suits you (`Duration::from_nanos(1)`). Panics, like `tokio::time::sleep`,
    /// on a runtime built without its time driver (`enable_time`), however quick the drain.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe as a report: dropping the future leaves the supervisor closed and its
    /// token cancelled, tasks keep ending on their own, and the report is lost. Call it again
    /// to wait once more.
    pub async fn shutdown(&self, grace: Duration) -> DrainReport {
        assert!(
            !grace.is_zero(),
            "Supervisor::shutdown: grace must be greater than zero"
        );
        let started = Instant::now();
        let me = tokio::task::try_id();
        let log = DrainLogGuard::open(self);
        self.close();
        self.shared.token.cancel();
        tracing::debug!(grace = ?grace, "supervisor draining");

        let budget_expired = !self.drained_by(me, started.checked_add(grace)).await;
        let mut unresponsive = Vec::new();
        if budget_expired {
            let stragglers: Vec<AbortHandle> = {
                let mut state = self.state();
                state.start_aborting(me);
                state
                    .tasks
                    .iter()
                    .filter(|(_, entry)| me.is_none() || entry.task() != me)
                    .filter_map(|(_, entry)| entry.abort.clone())
                    .collect()
            };
            // Aborting outside the lock: an abort never runs the task's drop inline today, but
            // the lock must not depend on that.
            for straggler in stragglers {
                straggler.abort();
            }
            if tokio::time::timeout(grace, self.wait_drained(me))
                .await
                .is_err()
            {
                unresponsive = self
                    .state()
                    .tasks
                    .iter()
                    .filter(|(_, entry)| me.is_none() || entry.task() != me)
                    .map(|(_, entry)| entry.name.clone())
                    .collect();
            }
        }
        let log = log.take();
        let report = DrainReport {
            finished: log.finished,
            failed: log.failed,
            panicked: log.panicked,
            aborted: log.aborted,
            unresponsive,
            budget_expired,
            elapsed: started.elapsed(),
            grace,
        };
        if report.is_clean() {
            tracing::debug!(%report, "supervisor drained");
        } else {
            tracing::warn!(%report, "supervisor drained with losses");
        }
        report
    }
}

/// This `shutdown` call's drain log; dropping it (a cancelled `shutdown`) removes the log.
struct DrainLogGuard<'a> {
    supervisor: &'a Supervisor,
    id: u64,
}

impl<'a> DrainLogGuard<'a> {
    fn open(supervisor: &'a Supervisor) -> Self {
        let mut state = supervisor.state();
        let id = state.next_drain;
        state.next_drain += 1;
        state.drains.push((id, DrainLog::default()));
        DrainLogGuard { supervisor, id }
    }

    fn take(self) -> DrainLog {
        let mut state = self.supervisor.state();
        let position = state.drains.iter().position(|(id, _)| *id == self.id);
        position.map_or_else(DrainLog::default, |index| state.drains.swap_remove(index).1)
    }
}

impl Drop for DrainLogGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.supervisor.state();
        state.drains.retain(|(id, _)| *id != self.id);
    }
}
