//! The retired abort handles (`registration::RETIRED_MAX`): kept on the multi-thread runtime
//! only, never more than the bound, swept by a later spawn and at the end of a drain. And
//! the drain callers `launch` spares (`State::spared`).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Supervisor;
use super::registration::{RETIRE_SIZE_MAX, RETIRED_MAX, RETIRED_SWEEP};

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn retired(supervisor: &Supervisor) -> usize {
    supervisor.state().retired.len()
}

/// Spawns `count` tasks that each wait for a gate before running `make()`'s future (so none
/// ends, and no sweep runs, before every task's handle is stored), opens the gate and waits
/// until they have all ended.
fn spawn_gated<F, Fut>(supervisor: &Supervisor, count: usize, make: F) -> impl Future<Output = ()>
where
    F: Fn() -> Fut,
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let gate = CancellationToken::new();
    for _ in 0..count {
        let gate = gate.clone();
        let work = make();
        drop(supervisor.spawn("gated", async move {
            gate.cancelled().await;
            work.await
        }));
    }
    gate.cancel();
    let supervisor = supervisor.clone();
    async move {
        while !supervisor.is_empty() {
            tokio::task::yield_now().await;
        }
    }
}

#[test]
fn ended_tasks_are_retired_within_the_bound_and_swept_by_the_next_spawn() {
    multi_thread().block_on(async {
        let supervisor = Supervisor::new(CancellationToken::new());
        spawn_gated(&supervisor, RETIRED_MAX + 10, || async {}).await;
        assert_eq!(
            retired(&supervisor),
            RETIRED_MAX,
            "the bound holds; the rest freed at once"
        );
        let token = supervisor.token();
        drop(supervisor.spawn("sweeper", async move { token.cancelled().await }));
        assert_eq!(retired(&supervisor), 0, "the spawn dropped them");
        supervisor.shutdown(Duration::from_secs(1)).await;
    });
}

#[test]
fn a_drain_drops_every_retired_handle() {
    multi_thread().block_on(async {
        let supervisor = Supervisor::new(CancellationToken::new());
        spawn_gated(&supervisor, RETIRED_SWEEP - 1, || async {}).await;
        assert_eq!(retired(&supervisor), RETIRED_SWEEP - 1);
        supervisor.close();
        supervisor.wait().await;
        assert_eq!(retired(&supervisor), 0);
    });
}

#[test]
fn tasks_on_the_current_thread_runtime_are_never_retired() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let supervisor = Supervisor::new(CancellationToken::new());
        spawn_gated(&supervisor, RETIRED_MAX, || async {}).await;
        assert_eq!(retired(&supervisor), 0);
    });
}

#[test]
fn tasks_with_a_large_future_are_never_retired() {
    multi_thread().block_on(async {
        let supervisor = Supervisor::new(CancellationToken::new());
        spawn_gated(&supervisor, RETIRED_SWEEP - 1, || {
            let large = [0_u8; RETIRE_SIZE_MAX + 1];
            async move {
                std::hint::black_box(&large);
            }
        })
        .await;
        assert_eq!(
            retired(&supervisor),
            0,
            "a future over the size is freed at once"
        );
        spawn_gated(&supervisor, RETIRED_SWEEP - 1, || async {
            [0_u8; RETIRE_SIZE_MAX + 1]
        })
        .await;
        assert_eq!(retired(&supervisor), 0, "so is an output over the size");
    });
}

/// The race this covers needs a spawning thread descheduled for longer than a drain's grace
/// between `spawn` and `launch`'s lock, which a test cannot arrange: the decision is checked
/// on the state directly.
#[tokio::test]
async fn a_drain_caller_whose_entry_has_no_handle_yet_is_spared_by_its_launch() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let caller = tokio::spawn(async { tokio::task::id() }).await.unwrap();
    let other = tokio::spawn(async { tokio::task::id() }).await.unwrap();
    let mut callers = Vec::new();
    for _ in 0..super::SPARED_MAX {
        callers.push(tokio::spawn(async { tokio::task::id() }).await.unwrap());
    }
    let mut state = supervisor.state();
    assert!(!state.aborts_at_launch(other), "no deadline passed yet");
    // The caller has no entry with a handle: it may be one of ours whose launch is pending.
    state.start_aborting(Some(caller));
    assert!(
        state.aborts_at_launch(other),
        "a task the sweep missed is aborted"
    );
    assert!(
        !state.aborts_at_launch(caller),
        "the drain's caller is left running"
    );
    assert!(state.spared.is_empty(), "spared once, then forgotten");
    // The same caller is remembered once; at most `SPARED_MAX` callers, the oldest
    // forgotten first.
    state.start_aborting(Some(caller));
    state.start_aborting(Some(caller));
    assert_eq!(state.spared.len(), 1);
    for id in &callers {
        state.start_aborting(Some(*id));
    }
    assert_eq!(state.spared.len(), super::SPARED_MAX);
    assert!(state.aborts_at_launch(caller), "the oldest was forgotten");
    assert!(!state.aborts_at_launch(callers[0]));
}

#[tokio::test]
async fn a_drain_caller_whose_entry_has_its_handle_is_not_remembered() {
    let supervisor = Supervisor::new(CancellationToken::new());
    let gate = CancellationToken::new();
    let task = supervisor
        .spawn("caller", {
            let gate = gate.clone();
            async move {
                gate.cancelled().await;
            }
        })
        .unwrap();
    let id = task.id();
    {
        let mut state = supervisor.state();
        state.start_aborting(Some(id));
        assert!(
            state.spared.is_empty(),
            "its launch is done: nothing to spare"
        );
    }
    gate.cancel();
    task.await.unwrap();
}
