//! A panicking handler is caught and counted, and its worker keeps serving.

use taskweave_pool::WorkerPool;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_handlers_never_shrink_the_pool() {
    let pool = WorkerPool::new(
        CancellationToken::new(),
        2,
        64,
        |_token, job: u32| async move {
            assert!(!job.is_multiple_of(3), "job {job} is cursed");
            Ok::<_, String>(job)
        },
    );
    let token = CancellationToken::new();
    for job in 0..30 {
        pool.submit(&token, job).await.unwrap();
    }
    assert_eq!(pool.metrics().workers_alive, 2);
    let report = pool.close().await;
    assert_eq!(report.metrics.panicked, 10);
    assert_eq!(report.metrics.completed, 20);
}
