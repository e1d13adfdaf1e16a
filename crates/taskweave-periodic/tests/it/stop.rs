//! Stopping: the token ends the runner, an in-flight run finishes, nothing leaks.

use std::time::Duration;

use taskweave_periodic::{FirstRun, Periodic};
use taskweave_testkit::{alive_tasks, assert_no_leaked_tasks};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);

#[tokio::test(start_paused = true)]
async fn cancelling_the_token_stops_a_waiting_runner_at_once() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let runner = Periodic::new(Duration::from_secs(60)).spawn(token.clone(), |_| async {});
    tokio::time::sleep(MS).await;
    let cancelled_at = Instant::now();
    token.cancel();
    let report = runner.await.unwrap();
    assert_eq!(cancelled_at.elapsed(), Duration::ZERO);
    assert_eq!(report.runs, 0);
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn an_already_cancelled_token_runs_nothing_even_when_immediate() {
    let token = CancellationToken::new();
    token.cancel();
    let report = Periodic::new(MS)
        .with_first_run(FirstRun::Immediately)
        .run(token, |_| async { unreachable!("must not run") as () })
        .await;
    assert_eq!(report.runs, 0);
}

#[tokio::test(start_paused = true)]
async fn a_run_in_progress_finishes_before_the_runner_returns() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let runner = Periodic::new(100 * MS)
        .with_first_run(FirstRun::Immediately)
        .spawn(token.clone(), |run_token| async move {
            run_token.cancelled().await;
            // Cleanup that must not be cut halfway by the shutdown.
            tokio::time::sleep(30 * MS).await;
        });
    tokio::time::sleep(10 * MS).await;
    let cancelled_at = Instant::now();
    token.cancel();
    let report = runner.await.unwrap();
    assert_eq!(cancelled_at.elapsed(), 30 * MS);
    assert_eq!((report.runs, report.succeeded), (1, 1));
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn dropping_the_runner_handle_does_not_stop_it_but_the_token_does() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    drop(Periodic::new(10 * MS).spawn(token.clone(), |_| async {}));
    tokio::time::sleep(100 * MS).await;
    assert_eq!(alive_tasks(), baseline + 1);
    token.cancel();
    assert_no_leaked_tasks(baseline).await;
}

#[test]
#[should_panic(expected = "period must be greater than zero")]
fn zero_period_is_a_programmer_error() {
    let _ = Periodic::new(Duration::ZERO);
}

#[test]
#[should_panic(expected = "timeout must be greater than zero")]
fn zero_timeout_is_a_programmer_error() {
    let _ = Periodic::new(MS).with_timeout(Duration::ZERO);
}
