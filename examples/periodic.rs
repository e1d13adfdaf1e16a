//! A periodic cache refresher: immediate first run, per-run timeout, jitter, a slow run whose
//! missed ticks are skipped, and a report when the token stops it.

#[path = "support.rs"]
mod support;

use std::time::Duration;

use taskweave::periodic::{FirstRun, MissedTicks, Periodic, Schedule};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    support::init_logging("warn");
    let token = CancellationToken::new();
    let started = Instant::now();

    let mut refresh = 0;
    let refresher = Periodic::new(Duration::from_millis(100))
        .with_name("cache-refresher")
        .with_first_run(FirstRun::Immediately)
        .with_missed_ticks(MissedTicks::Skip)
        .with_timeout(Duration::from_millis(300))
        .with_jitter(Duration::from_millis(10))
        .spawn(token.clone(), move |_run_token| {
            refresh += 1;
            let this = refresh;
            println!("refresh {this} at {} ms", started.elapsed().as_millis());
            async move {
                // The third refresh is slow: 250 ms, so the ticks at 300 and 400 ms are skipped.
                let work = if this == 3 { 250 } else { 5 };
                tokio::time::sleep(Duration::from_millis(work)).await;
                Ok::<(), std::io::Error>(())
            }
        });

    // A fixed-gap job: the pause is measured from the end of each run.
    let mut compaction = 0;
    let compactor = Periodic::new(Duration::from_millis(200))
        .with_name("compactor")
        .with_schedule(Schedule::FixedGap)
        .spawn(token.clone(), move |_run_token| {
            compaction += 1;
            let this = compaction;
            println!("compaction {this} at {} ms", started.elapsed().as_millis());
            tokio::time::sleep(Duration::from_millis(50))
        });

    tokio::time::sleep(Duration::from_millis(900)).await;
    token.cancel();
    println!("cache-refresher: {}", refresher.await.expect("no panic"));
    println!("compactor: {}", compactor.await.expect("no panic"));
}
