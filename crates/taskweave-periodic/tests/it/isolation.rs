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
    let dropped = Arc::new(AtomicBool::new(false));
    let (seen, dropped_flag) = (Arc::clone(&observed), Arc::clone(&dropped));
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
            let guard = SetOnDrop(Arc::clone(&dropped_flag));
            async move {
                std::future::pending::<()>().await;
                drop(guard);
            }
        })
        .await;
    assert_eq!(report.timed_out, 1);
    assert_eq!(started.elapsed(), 150 * MS);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the timed-out run's future was dropped"
    );
    tokio::task::yield_now().await;
    assert!(observed.load(Ordering::SeqCst));
}

struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Every `tracing` event of this test binary, from every thread (one global subscriber: scoped
/// ones on concurrent test threads make `tracing`'s interest cache flaky).
fn captured_logs() -> &'static Arc<std::sync::Mutex<Vec<u8>>> {
    static LOGS: std::sync::OnceLock<Arc<std::sync::Mutex<Vec<u8>>>> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = Arc::clone(&buffer);
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Writer(Arc::clone(&sink)))
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        buffer
    })
}

struct Writer(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Writer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn failed_and_panicking_runs_are_logged_with_the_runner_name() {
    let logs = captured_logs();
    let token = CancellationToken::new();
    stop_after(&token, 250 * MS);
    let mut call = 0;
    Periodic::new(100 * MS)
        .with_name("logged-cleaner")
        .run(token, |_| {
            call += 1;
            let this = call;
            async move {
                assert!(this != 2, "corrupt row");
                if this == 1 {
                    Err("table locked")
                } else {
                    Ok(())
                }
            }
        })
        .await;
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("logged-cleaner"))
        .collect();
    assert!(
        lines.iter().any(|line| line.contains("WARN")
            && line.contains("periodic run failed")
            && line.contains("table locked")),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|line| line.contains("ERROR")
            && line.contains("task panicked")
            && line.contains("corrupt row")),
        "{lines:#?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_run_whose_future_panics_when_dropped_does_not_stop_the_schedule() {
    // The runner drops a timed-out run's future: its destructor is user code, and a panic
    // there is a panicked run, not the end of the runner.
    let token = CancellationToken::new();
    stop_after(&token, 350 * MS);
    let report = Periodic::new(100 * MS)
        .with_first_run(FirstRun::Immediately)
        .with_timeout(50 * MS)
        .run(token, |_run_token| async {
            let _guard = taskweave_testkit::PanicOnDrop("the timed-out run");
            tokio::time::sleep(Duration::from_secs(60)).await;
        })
        .await;
    assert_eq!(report.runs, 4);
    assert_eq!(report.panicked, 4);
    assert_eq!(
        report.timed_out, 0,
        "each one is counted once, as what ended it"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failure_whose_display_or_drop_panics_is_a_panicked_run() {
    let token = CancellationToken::new();
    stop_after(&token, 150 * MS);
    let calls = AtomicU32::new(0);
    let report = Periodic::new(100 * MS)
        .with_first_run(FirstRun::Immediately)
        .run(token, |_run_token| {
            let call = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if call == 0 {
                    Err(taskweave_testkit::PanicOnDrop("the error"))
                } else {
                    Ok(())
                }
            }
        })
        .await;
    assert_eq!((report.runs, report.panicked, report.succeeded), (2, 1, 1));
}

/// Panics when dropped.
struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("run future dropped");
    }
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_run_whose_drop_panics_still_has_its_token_cancelled() {
    let token = CancellationToken::new();
    stop_after(&token, 150 * MS);
    let seen_at = Arc::new(std::sync::Mutex::new(Vec::new()));
    let started = Instant::now();
    let report = Periodic::new(100 * MS)
        .with_timeout(20 * MS)
        .run(token, {
            let seen_at = Arc::clone(&seen_at);
            move |run_token| {
                let seen_at = Arc::clone(&seen_at);
                tokio::spawn(async move {
                    run_token.cancelled().await;
                    seen_at.lock().unwrap().push(started.elapsed());
                });
                let guard = PanicOnDrop;
                async move {
                    std::future::pending::<()>().await;
                    drop(guard);
                }
            }
        })
        .await;
    // One run, at 100 ms (the first tick is one period in), timed out at 120 ms.
    assert_eq!(report.panicked, 1, "dropping the run panicked: {report:?}");
    assert_eq!(
        *seen_at.lock().unwrap(),
        [120 * MS],
        "the run's helper stopped at its timeout, not with the runner at 150 ms"
    );
}
