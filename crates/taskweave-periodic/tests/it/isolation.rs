//! A failing, panicking or hanging run is counted and the schedule goes on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use taskweave_periodic::{FirstRun, Periodic};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);

fn stop_after(token: &CancellationToken, after: Duration) {
    let token = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        token.cancel();
    });
}

#[tokio::test(start_paused = true)]
async fn failures_panics_and_timeouts_are_counted_and_the_schedule_goes_on() {
    let token = CancellationToken::new();
    stop_after(&token, 550 * MS);
    let calls = AtomicU32::new(0);
    let report = Periodic::new(100 * MS)
        .with_name("mixed")
        .with_first_run(FirstRun::Immediately)
        .with_timeout(50 * MS)
        .run(token, |_run_token| {
            let call = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                match call {
                    1 => Err("upstream unavailable"),
                    2 => panic!("bad row"),
                    3 => {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        Ok(())
                    }
                    _ => Ok(()),
                }
            }
        })
        .await;
    assert_eq!(report.runs, 6);
    assert_eq!(report.succeeded, 3);
    assert_eq!(report.failed, 1);
    assert_eq!(report.panicked, 1);
    assert_eq!(report.timed_out, 1);
    assert_eq!(
        report.to_string(),
        "6 runs: 3 succeeded, 1 failed, 1 timed out, 1 panicked; 0 ticks skipped"
    );
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_the_job_closure_itself_is_isolated() {
    let token = CancellationToken::new();
    stop_after(&token, 250 * MS);
    let mut calls = 0;
    let report = Periodic::new(100 * MS)
        .run(token, |_run_token| {
            calls += 1;
            assert!(calls != 1, "closure exploded before returning a future");
            async {}
        })
        .await;
    assert_eq!((report.runs, report.panicked, report.succeeded), (2, 1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_run_sees_its_token_cancelled_and_is_dropped() {
    let token = CancellationToken::new();
    stop_after(&token, 150 * MS);
    let observed = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&observed);
    let started = Instant::now();
    let report = Periodic::new(100 * MS)
        .with_timeout(20 * MS)
        .run(token, move |run_token| {
            let seen = Arc::clone(&seen);
            // The run hands its token to a helper task; the helper sees the timeout.
            tokio::spawn(async move {
                run_token.cancelled().await;
                seen.store(true, Ordering::SeqCst);
            });
            std::future::pending::<()>()
        })
        .await;
    assert_eq!(report.timed_out, 1);
    assert_eq!(started.elapsed(), 150 * MS);
    tokio::task::yield_now().await;
    assert!(observed.load(Ordering::SeqCst));
}
