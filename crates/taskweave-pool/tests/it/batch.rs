//! The batch runner: every result by index, a concurrency bound, cancellation hands back jobs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use taskweave_pool::{JobError, run};
use tokio_util::sync::CancellationToken;

use crate::support::{alive_tasks, assert_no_leaked_tasks};

#[tokio::test(start_paused = true)]
async fn every_result_comes_back_tagged_with_its_index() {
    let baseline = alive_tasks();
    // Later jobs finish first; the report is still in index order.
    let report = run(
        CancellationToken::new(),
        4,
        0..8_u64,
        |_token, n| async move {
            tokio::time::sleep(Duration::from_millis(100 - n * 10)).await;
            match n {
                3 => Err(format!("job {n} failed")),
                5 => panic!("job {n} exploded"),
                _ => Ok(n * 2),
            }
        },
    )
    .await;
    assert!(!report.cancelled);
    assert!(report.unstarted.is_empty());
    let indices: Vec<usize> = report.results.iter().map(|(index, _)| *index).collect();
    assert_eq!(indices, (0..8).collect::<Vec<_>>());
    assert_eq!(report.results[2].1.as_ref().unwrap(), &4);
    assert!(matches!(&report.results[3].1, Err(JobError::Failed(e)) if e == "job 3 failed"));
    assert!(
        matches!(&report.results[5].1, Err(JobError::Panicked(p)) if p.message() == "job 5 exploded")
    );
    assert_eq!(report.error_count(), 2);
    assert!(!report.is_success());
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn at_most_the_given_number_of_handlers_run_at_once() {
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (running_in, peak_in) = (Arc::clone(&running), Arc::clone(&peak));
    let report = run(CancellationToken::new(), 3, 0..20_u64, move |_token, n| {
        let (running, peak) = (Arc::clone(&running_in), Arc::clone(&peak_in));
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1 + n % 7)).await;
            running.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, String>(())
        }
    })
    .await;
    assert!(report.is_success());
    assert_eq!(peak.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn cancellation_stops_new_jobs_and_hands_back_the_unstarted_ones() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let canceller = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(250)).await;
        canceller.cancel();
    });
    // 2 workers, 100 ms per job: jobs 0..=5 start before 250 ms (at 0, 0, 100, 100, 200, 200).
    let report = run(
        token,
        2,
        ["a", "b", "c", "d", "e", "f", "g", "h"],
        |job_token, job| async move {
            tokio::select! {
                () = job_token.cancelled() => Err(format!("{job} interrupted")),
                () = tokio::time::sleep(Duration::from_millis(100)) => Ok(job),
            }
        },
    )
    .await;
    assert!(report.cancelled);
    assert_eq!(report.results.len(), 6);
    assert_eq!(
        report.error_count(),
        2,
        "the two running at 250 ms saw their token"
    );
    let unstarted: Vec<_> = report
        .unstarted
        .iter()
        .map(|(index, job)| (*index, *job))
        .collect();
    assert_eq!(unstarted, [(6, "g"), (7, "h")]);
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test]
async fn an_empty_batch_returns_an_empty_report() {
    let report = run(
        CancellationToken::new(),
        4,
        Vec::<u8>::new(),
        |_token, n| async move { Ok::<_, String>(n) },
    )
    .await;
    assert!(report.results.is_empty() && report.unstarted.is_empty() && !report.cancelled);
}

#[tokio::test]
async fn a_panic_in_the_handler_closure_itself_is_caught() {
    let report = run(CancellationToken::new(), 1, [1, 2], |_token, n: u8| {
        assert!(n != 1, "closure exploded");
        async move { Ok::<_, String>(n) }
    })
    .await;
    assert!(report.results[0].1.as_ref().unwrap_err().is_panic());
    assert_eq!(report.results[1].1.as_ref().unwrap(), &2);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_run_aborts_its_workers() {
    let baseline = alive_tasks();
    let batch = run(CancellationToken::new(), 2, 0..4, |_token, _n: u8| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, String>(())
    });
    let timed_out = tokio::time::timeout(Duration::from_millis(10), batch).await;
    assert!(timed_out.is_err());
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test]
#[should_panic(expected = "workers must be greater than zero")]
async fn zero_workers_is_a_programmer_error() {
    let _ = run(
        CancellationToken::new(),
        0,
        [1],
        |_token, n: u8| async move { Ok::<_, String>(n) },
    )
    .await;
}
