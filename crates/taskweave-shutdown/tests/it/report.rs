//! The report as a table and as JSON, and the runtime's shutdown timeout.

use std::time::Duration;

use taskweave_shutdown::Shutdown;
use tokio_util::sync::CancellationToken;

#[tokio::test(start_paused = true)]
async fn the_table_lists_every_step_in_order_with_its_status() {
    let shutdown = Shutdown::new(CancellationToken::new(), Duration::from_secs(6));
    shutdown.phase("http drain", |_ctx| async {});
    shutdown.phase("consumer", |ctx| async move {
        ctx.token().cancelled().await;
        std::future::pending::<()>().await
    });
    shutdown.resource("database", |_ctx| async {});
    let table = shutdown.run_now("deploy").await.to_string();
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("shutdown (requested: deploy): NOT clean in "),
        "{table}"
    );
    let rows: Vec<Vec<&str>> = lines[2..]
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0][..4], ["1", "readiness", "delay", "readiness"]);
    assert_eq!(rows[1][..4], ["2", "http", "drain", "phase"]);
    assert_eq!(rows[2][..5], ["3", "consumer", "phase", "timed", "out"]);
    assert!(lines[4].ends_with("cut off at its deadline"), "{table}");
    assert_eq!(
        rows[3][..5],
        ["4", "critical", "sections", "critical", "completed"]
    );
    assert_eq!(rows[4][..4], ["5", "database", "resource", "completed"]);
}

#[cfg(feature = "json")]
#[tokio::test(start_paused = true)]
async fn the_json_carries_the_same_facts() {
    let shutdown = Shutdown::new(CancellationToken::new(), Duration::from_secs(2));
    shutdown.phase("boom", |_ctx| async { panic!("broken flush") });
    let json = shutdown.run_now("test").await.to_json();
    for expected in [
        r#""trigger":"requested: test""#,
        r#""budget_ms":2000"#,
        r#""name":"boom""#,
        r#""status":"panicked""#,
        r#""panic":"broken flush""#,
        r#""clean":false"#,
    ] {
        assert!(json.contains(expected), "{expected} in {json}");
    }
}

#[test]
fn the_runtime_is_shut_down_without_waiting_for_a_stray_blocking_task() {
    // A stray blocking task that only returns when the test releases it, at the very end.
    let (release, stuck) = std::sync::mpsc::channel::<()>();
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let value = taskweave_shutdown::block_on(runtime, Duration::from_millis(50), async move {
            tokio::task::spawn_blocking(move || {
                let _ = stuck.recv();
            });
            7
        });
        let _ = done_tx.send(value);
    });
    // Dropping the runtime normally would wait for the blocking task, which waits for us.
    let value = done.recv_timeout(Duration::from_secs(10));
    drop(release);
    assert_eq!(value, Ok(7), "block_on waited for the blocking task");
}
