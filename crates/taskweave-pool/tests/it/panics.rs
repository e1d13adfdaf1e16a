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

/// A value whose `Drop` panics: user code the pool runs when it drops a job's outcome.
struct Bomb(u32);

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("bomb {} went off in drop", self.0);
    }
}

impl std::fmt::Display for Bomb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bomb {}", self.0)
    }
}

#[tokio::test]
async fn a_panicking_drop_of_an_output_or_error_never_kills_the_worker() {
    // One worker, no results stream: every outcome is dropped on the worker.
    let pool = WorkerPool::new(
        CancellationToken::new(),
        1,
        8,
        |_context, job: u32| async move {
            if job.is_multiple_of(2) {
                Ok(Bomb(job))
            } else {
                Err(Bomb(job))
            }
        },
    );
    for job in 0..3 {
        pool.try_submit(job).unwrap();
    }
    while pool.metrics().cleanup_panicked < 3 {
        tokio::task::yield_now().await;
    }
    // The worker is still there and the pool still takes jobs.
    let m = pool.metrics();
    assert_eq!(
        (m.workers_alive, m.completed, m.failed, m.panicked),
        (1, 2, 1, 0)
    );
    assert!(!pool.is_closed(), "nobody closed the pool");
    pool.try_submit(4).unwrap();
    let report = pool.close().await;
    assert!(
        report.handed_back.is_empty(),
        "close lets queued jobs finish"
    );
    let m = report.metrics;
    assert_eq!((m.completed, m.failed, m.cleanup_panicked), (3, 1, 4));
    crate::support::assert_books_balance(&m, "after close");
}

#[tokio::test]
async fn a_panicking_drop_after_the_results_stream_was_dropped_never_kills_the_worker() {
    let pool = WorkerPool::builder(1, 8)
        .results(1)
        .spawn(CancellationToken::new(), |_context, job: u32| async move {
            Ok::<_, String>(Bomb(job))
        });
    drop(pool.results().unwrap());
    for job in 0..3 {
        pool.try_submit(job).unwrap();
    }
    let report = pool.close().await;
    assert!(report.handed_back.is_empty());
    assert_eq!(
        (report.metrics.completed, report.metrics.cleanup_panicked),
        (3, 3)
    );
}

#[tokio::test]
async fn a_panicking_on_dropped_callback_is_caught_and_the_job_still_counts_as_dropped() {
    let pool = WorkerPool::builder(1, 1)
        .overflow(taskweave_pool::Overflow::DropOldest)
        .on_dropped(|index, _job: u32| panic!("on_dropped for job {index} exploded"))
        .spawn(CancellationToken::new(), |_context, job: u32| async move {
            Ok::<_, String>(job)
        });
    // Nothing runs until this task yields: the second and third submits each evict one.
    for job in 0..3 {
        pool.try_submit(job).unwrap();
    }
    let report = pool.close().await;
    let m = report.metrics;
    assert_eq!((m.completed, m.dropped, m.cleanup_panicked), (1, 2, 2));
    crate::support::assert_books_balance(&m, "after close");
}

#[tokio::test]
async fn every_leftover_gets_its_callback_when_one_callback_panics() {
    // The pool is dropped after a cancellation without a close: its unstarted jobs go to
    // `on_dropped`, one by one; the panic of one callback must not skip the others, nor
    // escape into the code that dropped the pool.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let token = CancellationToken::new();
    let pool = WorkerPool::builder(1, 8)
        .on_dropped({
            let seen = Arc::clone(&seen);
            move |index, _job: u32| {
                seen.lock().unwrap().push(index);
                assert!(index != 2, "on_dropped for job {index} exploded");
            }
        })
        .spawn(token.clone(), |context, _job: u32| async move {
            context.cancelled().await;
            Ok::<_, String>(())
        });
    for job in 0..4 {
        pool.try_submit(job).unwrap();
    }
    while pool.in_flight() < 1 {
        tokio::task::yield_now().await;
    }
    token.cancel();
    while pool.metrics().workers_alive > 0 {
        tokio::task::yield_now().await;
    }
    drop(pool);
    assert_eq!(*seen.lock().unwrap(), [1, 2, 3]);
}

/// An outcome whose `Drop` panics.
struct PanicsWhenDropped;

impl Drop for PanicsWhenDropped {
    fn drop(&mut self) {
        panic!("outcome dropped");
    }
}

#[tokio::test]
async fn outcomes_whose_drop_panics_in_an_untaken_stream_skip_no_leftover() {
    // A results stream nobody took holds outcomes whose `Drop` panics. The pool is dropped
    // after a cancellation without a close: the stream goes with it, and every unstarted job
    // still gets its `on_dropped`; no panic escapes into the code that dropped the pool.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let token = CancellationToken::new();
    let pool = WorkerPool::builder(1, 8)
        .results(8)
        .on_dropped({
            let seen = Arc::clone(&seen);
            move |index, _job: u32| seen.lock().unwrap().push(index)
        })
        .spawn(token.clone(), |context, job: u32| async move {
            if job >= 2 {
                context.cancelled().await;
            }
            Ok::<_, String>(PanicsWhenDropped)
        });
    for job in 0..6 {
        pool.try_submit(job).unwrap();
    }
    while pool.in_flight() < 1 || pool.metrics().completed < 2 {
        tokio::task::yield_now().await;
    }
    token.cancel();
    while pool.metrics().workers_alive > 0 {
        tokio::task::yield_now().await;
    }
    drop(pool);
    assert_eq!(*seen.lock().unwrap(), [3, 4, 5]);
}

#[test]
fn a_job_running_when_the_runtime_shuts_down_is_counted_as_abandoned() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let pool = runtime.block_on(async {
        let pool = WorkerPool::new(CancellationToken::new(), 1, 8, |_context, _job: u32| {
            std::future::pending::<Result<(), String>>()
        });
        for job in 0..5 {
            pool.try_submit(job).unwrap();
        }
        while pool.in_flight() < 1 {
            tokio::task::yield_now().await;
        }
        pool
    });
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    let other = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let report = other.block_on(pool.close());
    let m = report.metrics;
    assert_eq!((m.submitted, m.completed, m.abandoned), (5, 0, 1));
    assert_eq!(report.handed_back.len(), 4);
    assert_eq!((m.in_flight, m.workers_alive, m.queued), (0, 0, 0));
    crate::support::assert_books_balance(&m, "after the runtime shut down");
}
