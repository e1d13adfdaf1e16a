//! `Supervisor`: refusal after close, drain by deadline, reports, metrics, no leaks.

use std::time::Duration;

use proptest::prelude::*;
use taskweave_supervise::{Supervisor, SupervisorMetrics, TaskError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::support::{alive_tasks, assert_no_leaked_tasks};

const MS: Duration = Duration::from_millis(1);

// Reference behaviour: a 50 ms task and a 100 ms budget → "all work finished".
#[tokio::test(start_paused = true)]
async fn work_within_the_budget_finishes_and_the_report_says_so() {
    let baseline = alive_tasks();
    let supervisor = Supervisor::new(CancellationToken::new());
    supervisor
        .spawn("quick", tokio::time::sleep(50 * MS))
        .unwrap();
    let started = Instant::now();
    let report = supervisor.shutdown(100 * MS).await;
    assert_eq!(started.elapsed(), 50 * MS);
    assert!(report.is_clean());
    assert!(!report.budget_expired);
    assert_eq!(report.finished, ["quick"]);
    assert!(report.aborted.is_empty());
    assert_eq!(report.to_string(), "all work finished: 1 task in 50ms");
    assert_no_leaked_tasks(baseline).await;
}

// Reference behaviour: a 2 s task and a 100 ms budget → "drain budget expired".
#[tokio::test(start_paused = true)]
async fn work_beyond_the_budget_is_aborted_and_named() {
    let baseline = alive_tasks();
    let supervisor = Supervisor::new(CancellationToken::new());
    supervisor.spawn("quick", tokio::time::sleep(MS)).unwrap();
    let slow = supervisor
        .spawn("slow", tokio::time::sleep(Duration::from_secs(2)))
        .unwrap();
    let started = Instant::now();
    let report = supervisor.shutdown(100 * MS).await;
    assert_eq!(started.elapsed(), 100 * MS);
    assert!(report.budget_expired);
    assert!(!report.is_clean());
    assert_eq!(report.finished, ["quick"]);
    assert_eq!(report.aborted, ["slow"]);
    assert_eq!(
        report.to_string(),
        "drain budget expired after 100ms; finished 1; aborted `slow`"
    );
    assert!(slow.await.unwrap_err().is_aborted());
    assert!(supervisor.is_empty());
    assert_no_leaked_tasks(baseline).await;
}

// Reference behaviour: "accepted after close: false".
#[tokio::test]
async fn spawn_after_close_is_refused_and_hands_the_future_back() {
    let supervisor = Supervisor::new(CancellationToken::new());
    assert!(!supervisor.is_closed());
    assert!(supervisor.close());
    assert!(!supervisor.close(), "close is idempotent and says so");
    assert!(supervisor.is_closed());
    let refused = supervisor
        .spawn("late", async { "ran anyway" })
        .unwrap_err();
    assert!(matches!(
        refused,
        taskweave_supervise::SpawnError::Closed(_)
    ));
    assert_eq!(refused.to_string(), "spawn refused: closed");
    assert_eq!(refused.into_inner().await, "ran anyway");
    assert_eq!(supervisor.metrics().refused, 1);
    assert_eq!(supervisor.metrics().spawned, 0);
}

#[tokio::test(start_paused = true)]
async fn spawn_after_shutdown_is_refused() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let report = supervisor.shutdown(MS).await;
    assert!(report.is_clean());
    assert_eq!(report.to_string(), "all work finished: 0 tasks in 0ns");
    assert!(supervisor.spawn("late", async {}).is_err());
}

#[tokio::test(start_paused = true)]
async fn shutdown_cancels_the_token_so_cooperative_tasks_finish() {
    let parent = CancellationToken::new();
    let supervisor = Supervisor::new(parent.clone());
    let token = supervisor.token();
    let task = supervisor
        .spawn("listener", async move {
            token.cancelled().await;
            "stopped cleanly"
        })
        .unwrap();
    let report = supervisor.shutdown(Duration::from_secs(1)).await;
    assert_eq!(report.finished, ["listener"]);
    assert_eq!(report.elapsed, Duration::ZERO);
    assert_eq!(task.await.unwrap(), "stopped cleanly");
    assert!(
        !parent.is_cancelled(),
        "a supervisor never cancels its parent"
    );
}

// The deadline's timer is registered only after one scheduling round, but the grace counts
// from the call: the clock moves 20 ms during that round (the task advances it), and the
// stubborn task is still aborted 50 ms after the call, not 50 ms after the registration.
#[tokio::test(start_paused = true)]
async fn the_grace_counts_from_the_call_though_its_timer_is_registered_a_round_later() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let token = supervisor.token();
    supervisor
        .spawn("winding-down", async move {
            token.cancelled().await;
            tokio::time::advance(20 * MS).await;
            tokio::time::sleep(20 * MS).await;
        })
        .unwrap();
    supervisor
        .spawn("stubborn", tokio::time::sleep(Duration::from_secs(5)))
        .unwrap();
    let started = Instant::now();
    let report = supervisor.shutdown(50 * MS).await;
    assert_eq!(report.finished, ["winding-down"]);
    assert_eq!(report.aborted, ["stubborn"]);
    assert!(report.budget_expired);
    assert_eq!(started.elapsed(), 50 * MS, "the grace counts from the call");
}

// The deadline's timer is registered late, but created at once: a runtime without timers
// is found out by every `shutdown`, not only by a slow drain.
#[test]
#[should_panic(expected = "timers")]
fn shutdown_on_a_runtime_without_timers_panics_even_when_the_drain_is_quick() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let supervisor = Supervisor::new(CancellationToken::new());
        supervisor.close();
        let _ = supervisor.shutdown(Duration::from_secs(1)).await;
    });
}

#[tokio::test(start_paused = true)]
async fn a_grace_too_long_for_a_deadline_drains_without_one() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let token = supervisor.token();
    supervisor
        .spawn("listener", async move {
            token.cancelled().await;
            tokio::time::sleep(Duration::from_secs(3600)).await;
        })
        .unwrap();
    let report = supervisor.shutdown(Duration::MAX).await;
    assert!(report.is_clean());
    assert_eq!(report.finished, ["listener"]);
    assert_eq!(report.elapsed, Duration::from_secs(3600));
}

#[tokio::test(start_paused = true)]
async fn parent_cancellation_reaches_the_supervisor_token() {
    let parent = CancellationToken::new();
    let supervisor = Supervisor::new(parent.clone());
    parent.cancel();
    assert!(supervisor.token().is_cancelled());
}

// Reference behaviour: a panicking task leaves the process and the other tasks running.
#[tokio::test(start_paused = true)]
async fn a_panicking_task_is_reported_and_the_others_keep_running() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let token = supervisor.token();
    let steady = supervisor
        .spawn("steady", async move {
            let mut ticks = 0_u32;
            while !token.is_cancelled() {
                tokio::time::sleep(10 * MS).await;
                ticks += 1;
            }
            ticks
        })
        .unwrap();
    let broken = supervisor
        .spawn("broken", async { panic!("worker exploded") })
        .unwrap();
    let error = broken.await.unwrap_err();
    assert!(matches!(&error, TaskError::Panicked(p) if p.message() == "worker exploded"));
    tokio::time::sleep(100 * MS).await;
    assert_eq!(supervisor.running(), ["steady"]);
    let report = supervisor.shutdown(Duration::from_secs(1)).await;
    assert_eq!(report.finished, ["steady"]);
    assert!(steady.await.unwrap() >= 10);
    let metrics = supervisor.metrics();
    assert_eq!(
        (metrics.spawned, metrics.completed, metrics.panicked),
        (2, 1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_panic_during_the_drain_is_named_in_the_report() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let token = supervisor.token();
    supervisor
        .spawn("fragile", async move {
            token.cancelled().await;
            panic!("could not flush");
        })
        .unwrap();
    let report = supervisor.shutdown(Duration::from_secs(1)).await;
    assert!(!report.budget_expired);
    assert!(!report.is_clean());
    assert_eq!(report.panicked, ["fragile"]);
    assert_eq!(
        report.to_string(),
        "drained in 0ns with losses; finished 0; panicked `fragile`"
    );
}

#[tokio::test(start_paused = true)]
async fn len_and_running_follow_the_tasks() {
    let supervisor = Supervisor::new(CancellationToken::new());
    assert!(supervisor.is_empty());
    supervisor.spawn("a", tokio::time::sleep(10 * MS)).unwrap();
    supervisor.spawn("b", tokio::time::sleep(20 * MS)).unwrap();
    assert_eq!(supervisor.len(), 2);
    tokio::time::sleep(15 * MS).await;
    assert_eq!(supervisor.running(), ["b"]);
    tokio::time::sleep(10 * MS).await;
    assert!(supervisor.is_empty());
}

#[tokio::test(start_paused = true)]
async fn wait_returns_after_close_once_every_task_ended() {
    let supervisor = Supervisor::new(CancellationToken::new());
    supervisor.spawn("a", tokio::time::sleep(30 * MS)).unwrap();
    supervisor.close();
    let started = Instant::now();
    supervisor.wait().await;
    assert_eq!(started.elapsed(), 30 * MS);
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "grace must be greater than zero")]
async fn zero_grace_is_a_programmer_error() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let _ = supervisor.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_on_the_multi_thread_runtime_are_all_accounted_for() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let mut handles = Vec::new();
    for index in 0..500_u32 {
        let handle = supervisor
            .spawn(format!("task-{index}"), async move {
                tokio::task::yield_now().await;
                assert!(index % 50 != 7, "planned failure {index}");
                index
            })
            .unwrap();
        handles.push(handle);
    }
    let mut panicked = 0;
    for handle in handles {
        if handle.await.is_err() {
            panicked += 1;
        }
    }
    assert_eq!(panicked, 10);
    let report = supervisor.shutdown(Duration::from_secs(5)).await;
    assert!(report.is_clean());
    let metrics = supervisor.metrics();
    assert_eq!(metrics.spawned, 500);
    assert_eq!(metrics.completed, 490);
    assert_eq!(metrics.panicked, 10);
    assert_eq!(metrics.running, 0);
}

/// What a generated task does.
#[derive(Clone, Copy, Debug)]
enum Plan {
    /// Finishes after this many milliseconds.
    Finish(u64),
    /// Panics after this many milliseconds.
    Panic(u64),
    /// Ignores the token and would run for a minute.
    Hang,
}

fn plan() -> impl Strategy<Value = Plan> {
    prop_oneof![
        // Task times are even and drain times odd, so no task ends on the very instant the
        // drain starts or its budget expires (the order of same-instant timers is unspecified).
        (0_u64..100).prop_map(|half| Plan::Finish(2 * half)),
        (0_u64..100).prop_map(|half| Plan::Panic(2 * half)),
        Just(Plan::Hang),
    ]
}

fn run_plans(plans: &[Plan], grace_ms: u64, close_after_ms: u64) -> (SupervisorMetrics, usize) {
    let runtime = taskweave_testkit::paused_runtime();
    runtime.block_on(async {
        let baseline = alive_tasks();
        let supervisor = Supervisor::new(CancellationToken::new());
        for (index, plan) in plans.iter().copied().enumerate() {
            let future = async move {
                match plan {
                    Plan::Finish(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                    Plan::Panic(ms) => {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        panic!("planned");
                    }
                    Plan::Hang => tokio::time::sleep(Duration::from_secs(60)).await,
                }
            };
            supervisor.spawn(format!("t{index}"), future).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(close_after_ms)).await;
        let report = supervisor.shutdown(Duration::from_millis(grace_ms)).await;
        let named = report.finished.len() + report.panicked.len() + report.aborted.len();
        assert_no_leaked_tasks(baseline).await;
        (supervisor.metrics(), named)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    // Every spawned task ends exactly once, in exactly one counter; the report names exactly
    // the tasks still running when the drain started, and every hanging task is aborted.
    #[test]
    fn every_task_is_accounted_for_exactly_once(
        plans in proptest::collection::vec(plan(), 0..24),
        grace_ms in (1_u64..150).prop_map(|half| 2 * half),
        close_after_ms in (0_u64..125).prop_map(|half| 2 * half + 1),
    ) {
        let (metrics, named) = run_plans(&plans, grace_ms, close_after_ms);
        let spawned = plans.len() as u64;
        prop_assert_eq!(metrics.spawned, spawned);
        prop_assert_eq!(metrics.running, 0);
        prop_assert_eq!(metrics.completed + metrics.failed + metrics.panicked + metrics.aborted, spawned);
        let expected_panics = plans.iter().filter(|plan| match plan {
            Plan::Panic(ms) => *ms < close_after_ms + grace_ms,
            _ => false,
        }).count() as u64;
        prop_assert_eq!(metrics.panicked, expected_panics);
        let hangs = plans.iter().filter(|plan| matches!(plan, Plan::Hang)).count() as u64;
        prop_assert!(metrics.aborted >= hangs);
        let still_running_at_close = plans.iter().filter(|plan| match plan {
            Plan::Finish(ms) | Plan::Panic(ms) => *ms >= close_after_ms,
            Plan::Hang => true,
        }).count();
        prop_assert_eq!(named, still_running_at_close);
    }
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_started_before_close_returns_once_closed_and_empty() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let waiter = supervisor.clone();
    let mut wait = tokio_test::task::spawn(async move { waiter.wait().await });
    tokio_test::assert_pending!(wait.poll());
    supervisor.close();
    assert!(wait.is_woken());
    tokio_test::assert_ready!(wait.poll());
}

#[tokio::test(start_paused = true)]
async fn a_task_aborted_through_its_handle_during_the_drain_is_named() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let stubborn = supervisor
        .spawn("stubborn", tokio::time::sleep(Duration::from_secs(60)))
        .unwrap();
    let aborter = tokio::spawn(async move {
        tokio::time::sleep(10 * MS).await;
        stubborn.abort();
    });
    let report = supervisor.shutdown(Duration::from_secs(1)).await;
    aborter.await.unwrap();
    assert!(!report.budget_expired);
    assert_eq!(report.aborted, ["stubborn"]);
    assert_eq!(report.elapsed, 10 * MS);
}

#[tokio::test(start_paused = true)]
async fn shutdown_from_one_of_its_own_tasks_drains_the_others() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let token = supervisor.token();
    supervisor
        .spawn("worker", async move { token.cancelled().await })
        .unwrap();
    let control = supervisor.clone();
    let controller = supervisor
        .spawn("controller", async move {
            control.shutdown(Duration::from_secs(1)).await
        })
        .unwrap();
    let report = controller.await.unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.finished, ["worker"]);
    assert_eq!(
        report.elapsed,
        Duration::ZERO,
        "the caller is not waited for"
    );
}

#[tokio::test(start_paused = true)]
async fn overlapping_shutdowns_each_report_what_ended_during_them() {
    let supervisor = Supervisor::new(CancellationToken::new());
    supervisor
        .spawn("early", tokio::time::sleep(10 * MS))
        .unwrap();
    supervisor
        .spawn("late", tokio::time::sleep(30 * MS))
        .unwrap();
    let first = supervisor.clone();
    let first = tokio::spawn(async move { first.shutdown(Duration::from_secs(1)).await });
    tokio::time::sleep(20 * MS).await;
    let second = supervisor.shutdown(Duration::from_secs(1)).await;
    let first = first.await.unwrap();
    assert_eq!(first.finished.len(), 2, "{first}");
    assert_eq!(
        second.finished,
        ["late"],
        "only what ended after it started"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_stuck_in_blocking_code_is_named_unresponsive() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let release = Arc::new(AtomicBool::new(false));
    let spinning = Arc::clone(&release);
    let supervisor = Supervisor::new(CancellationToken::new());
    supervisor
        .spawn("blocking-loop", async move {
            // Never yields: neither the token nor an abort can reach it.
            while !spinning.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
        })
        .unwrap();
    // This test needs the real clock: a paused clock only exists on the current-thread
    // runtime, which the blocking task would stall entirely.
    let report = supervisor.shutdown(20 * MS).await;
    release.store(true, Ordering::Release);
    assert!(report.budget_expired);
    assert_eq!(report.unresponsive, ["blocking-loop"]);
    assert!(report.aborted.is_empty());
    supervisor.wait().await;
}

#[test]
#[should_panic(expected = "Supervisor::spawn called outside a tokio runtime")]
fn spawn_outside_a_runtime_panics_before_claiming_a_slot() {
    let supervisor = Supervisor::new(CancellationToken::new());
    drop(supervisor.spawn("nowhere", async {}));
}

/// A handle of a runtime that has shut down: tokio drops a task spawned on it inside `spawn`.
fn shut_down_runtime() -> tokio::runtime::Handle {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let handle = runtime.handle().clone();
    drop(runtime);
    handle
}

/// User code in a `Drop` that reads the supervisor (taking its lock): it deadlocks if run
/// under that lock, and records that it ran.
struct ReadsTheSupervisor {
    supervisor: Supervisor,
    seen: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl ReadsTheSupervisor {
    /// The probe, and what it will have seen.
    fn new(supervisor: &Supervisor) -> (Self, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        let seen = std::sync::Arc::default();
        let probe = ReadsTheSupervisor {
            supervisor: supervisor.clone(),
            seen: std::sync::Arc::clone(&seen),
        };
        (probe, seen)
    }
}

impl Drop for ReadsTheSupervisor {
    fn drop(&mut self) {
        let len = self.supervisor.len();
        self.seen
            .store(len + 1, std::sync::atomic::Ordering::SeqCst);
    }
}

// tokio drops a task inside `spawn` when its runtime has shut down: the future's `Drop` (user
// code, here one that reads the supervisor, which takes its lock) must not run under the
// supervisor's lock, and the slot must still be freed and counted.
#[test]
fn a_spawn_on_a_runtime_that_shut_down_drops_the_future_outside_the_lock() {
    use std::sync::atomic::Ordering;

    let handle = shut_down_runtime();
    let _entered = handle.enter();
    let supervisor = Supervisor::new(CancellationToken::new());
    let (guard, seen) = ReadsTheSupervisor::new(&supervisor);
    let task = supervisor
        .spawn("too-late", async move {
            let _guard = guard;
        })
        .expect("the supervisor is open");
    assert_ne!(
        seen.load(Ordering::SeqCst),
        0,
        "the future was dropped inside spawn"
    );
    assert!(supervisor.is_empty(), "the slot was freed");
    let metrics = supervisor.metrics();
    assert_eq!(metrics.spawned, 1);
    assert_eq!(metrics.aborted, 1, "{metrics:?}");
    assert_eq!(metrics.running, 0);
    drop(task);
    drop(_entered);
    // Still usable, on a live runtime: a task spawned now runs and frees its slot.
    let live = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    live.block_on(async {
        let task = supervisor.spawn("later", async { 7 }).unwrap();
        assert_eq!(task.await.unwrap(), 7);
        assert!(supervisor.is_empty());
        assert_eq!(supervisor.metrics().completed, 1);
    });
}

// The same, with a future whose `Drop` panics: the spawn still returns its handle, the panic
// is caught (tokio catches it; the supervisor's lock is not held), and the books balance.
#[test]
fn a_future_that_panics_when_dropped_inside_spawn_is_caught_and_counted() {
    struct PanicsOnDrop;
    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            panic!("drop of an unstarted future");
        }
    }

    let handle = shut_down_runtime();
    let _entered = handle.enter();
    let supervisor = Supervisor::new(CancellationToken::new());
    let guard = PanicsOnDrop;
    let task = supervisor.spawn("too-late", async move {
        let _guard = guard;
    });
    assert!(
        task.is_ok(),
        "the supervisor is open: the spawn is accepted"
    );
    assert!(supervisor.is_empty(), "the slot was freed");
    let metrics = supervisor.metrics();
    assert_eq!(
        (metrics.spawned, metrics.aborted, metrics.running),
        (1, 1, 0),
        "{metrics:?}"
    );
    // The lock is free and not poisoned: the supervisor still closes and refuses.
    assert!(supervisor.close());
    assert!(supervisor.spawn("refused", async {}).is_err());
}

// `spawn_restarting` takes the same path: its factory (user code, here one whose `Drop` reads
// the supervisor) is dropped outside the lock when tokio drops the task inside `spawn`.
#[test]
fn a_restarting_spawn_on_a_runtime_that_shut_down_drops_the_factory_outside_the_lock() {
    use std::sync::atomic::Ordering;
    use taskweave_supervise::RestartPolicy;

    let handle = shut_down_runtime();
    let _entered = handle.enter();
    let supervisor = Supervisor::new(CancellationToken::new());
    let (guard, seen) = ReadsTheSupervisor::new(&supervisor);
    let policy = RestartPolicy::new(3, Duration::from_secs(60));
    let task = supervisor
        .spawn_restarting("too-late", policy, move |_token| {
            let _keep = &guard;
            async { Ok::<(), String>(()) }
        })
        .expect("the supervisor is open");
    assert_ne!(
        seen.load(Ordering::SeqCst),
        0,
        "the factory was dropped inside spawn"
    );
    assert!(supervisor.is_empty());
    assert_eq!(supervisor.metrics().aborted, 1);
    drop(task);
}
