//! A panicking handler is caught, logged with the job's index, counted, and its worker keeps
//! serving.

use std::sync::{Arc, Mutex, OnceLock};

use taskweave_pool::WorkerPool;
use tokio_util::sync::CancellationToken;

use crate::support::Gate;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_handlers_never_shrink_the_pool() {
    let gate = Gate::closed();
    let pool = WorkerPool::new(CancellationToken::new(), 2, 64, {
        let gate = gate.clone();
        move |_context, job: u32| {
            let gate = gate.clone();
            async move {
                if job < 10 {
                    panic!("job {job} is cursed");
                }
                gate.pass().await;
                Ok::<_, String>(job)
            }
        }
    });
    let token = CancellationToken::new();
    for job in 0..10 {
        pool.submit(&token, job).await.unwrap();
    }
    // Logging a panic resolves its backtrace, which takes a while: wait for all ten.
    while pool.metrics().panicked < 10 {
        tokio::task::yield_now().await;
    }
    // Two more jobs that block at the gate: both workers must still be there to take them.
    pool.submit(&token, 10).await.unwrap();
    pool.submit(&token, 11).await.unwrap();
    while pool.in_flight() < 2 {
        tokio::task::yield_now().await;
    }
    assert_eq!(pool.metrics().workers_alive, 2);
    gate.open(2);
    let report = pool.close().await;
    assert_eq!((report.metrics.panicked, report.metrics.completed), (10, 2));
}

fn captured() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&buffer);
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Writer(Arc::clone(&sink)))
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        buffer
    })
}

struct Writer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Writer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_panic_is_logged_with_the_pool_name_and_the_job_index() {
    let logs = captured();
    let pool = WorkerPool::builder(1, 8).name("invoices").spawn(
        CancellationToken::new(),
        |_context, job: u32| async move {
            assert!(job != 3, "bad invoice");
            Ok::<_, String>(())
        },
    );
    for job in 0..5 {
        pool.try_submit(job).unwrap();
    }
    assert_eq!(pool.close().await.metrics.panicked, 1);
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    let line = text
        .lines()
        .find(|line| line.contains("pool=invoices"))
        .unwrap_or_else(|| panic!("no log line for the pool in {text}"));
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("job=3"), "{line}");
    assert!(line.contains("panic=bad invoice"), "{line}");
    assert!(line.contains("backtrace="), "{line}");
}
