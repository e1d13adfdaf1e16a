//! The retired abort handles (`registration::RETIRED_MAX`): kept on the multi-thread runtime
//! only, never more than the bound, swept by a later spawn and at the end of a drain.

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

/// Waits until every task spawned so far has ended.
async fn until_idle(supervisor: &Supervisor) {
    while !supervisor.is_empty() {
        tokio::task::yield_now().await;
    }
}

#[test]
fn ended_tasks_are_retired_within_the_bound_and_swept_by_the_next_spawn() {
    multi_thread().block_on(async {
        let supervisor = Supervisor::new(CancellationToken::new());
        // Every task waits for the gate, so none ends (and no sweep runs) while spawning.
        let gate = CancellationToken::new();
        for _ in 0..RETIRED_MAX + 10 {
            let gate = gate.clone();
            drop(supervisor.spawn("gated", async move { gate.cancelled().await }));
        }
        gate.cancel();
        until_idle(&supervisor).await;
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
        for _ in 0..RETIRED_SWEEP - 1 {
            drop(supervisor.spawn("short", async {}));
        }
        until_idle(&supervisor).await;
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
        for _ in 0..RETIRED_MAX {
            drop(supervisor.spawn("short", async {}));
        }
        until_idle(&supervisor).await;
        assert_eq!(retired(&supervisor), 0);
    });
}

#[test]
fn tasks_with_a_large_future_are_never_retired() {
    multi_thread().block_on(async {
        let supervisor = Supervisor::new(CancellationToken::new());
        for _ in 0..RETIRED_SWEEP {
            let large = [0_u8; RETIRE_SIZE_MAX + 1];
            drop(supervisor.spawn("large", async move {
                std::hint::black_box(&large);
            }));
        }
        until_idle(&supervisor).await;
        assert_eq!(retired(&supervisor), 0);
    });
}
