//! Task groups: a page assembled from three sources where one fails (first error cancels the
//! rest), notifying users where some fail (collect every failure), and an ordered parallel map.

#[path = "support.rs"]
mod support;

use std::time::Duration;

use taskweave::group::{CollectGroup, TaskFailure, TaskGroup, map_parallel};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

async fn fetch(
    token: CancellationToken,
    source: &'static str,
    ms: u64,
    fail: bool,
) -> Result<(), String> {
    tokio::select! {
        () = token.cancelled() => {
            println!("  {source}: stopped, the page is failing anyway");
            Err(format!("{source}: cancelled"))
        }
        () = tokio::time::sleep(Duration::from_millis(ms)) => {
            if fail {
                println!("  {source}: failed after {ms} ms");
                Err(format!("{source}: 503 Service Unavailable"))
            } else {
                println!("  {source}: ok after {ms} ms");
                Ok(())
            }
        }
    }
}

#[tokio::main]
async fn main() {
    support::init_logging("warn");
    let root = CancellationToken::new();

    println!("assembling a page from three sources:");
    let started = Instant::now();
    let page = TaskGroup::new(root.clone());
    for (source, ms, fail) in [
        ("profile", 30, false),
        ("orders", 60, true),
        ("recommendations", 500, false),
    ] {
        page.spawn(fetch(page.token(), source, ms, fail))
            .await
            .expect("no limit");
    }
    match page.wait().await {
        Ok(()) => println!("page ready"),
        Err(TaskFailure::Failed(error)) => println!(
            "page failed after {} ms: {error}",
            started.elapsed().as_millis()
        ),
        Err(other) => println!("page failed: {other}"),
    }

    println!("\nnotifying users, 2 at a time:");
    let mut notify = CollectGroup::new(root.clone()).with_limit(2);
    for user in 1..=6_u32 {
        notify
            .spawn(format!("user-{user}"), async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                match user {
                    3 => Err("mailbox full".to_owned()),
                    5 => Err("address bounced".to_owned()),
                    _ => Ok(()),
                }
            })
            .await
            .expect("not cancelled");
    }
    let report = notify.wait().await;
    println!("{} notified; failed:", report.succeeded);
    for (user, failure) in &report.failures {
        println!("  {user}: {failure}");
    }

    println!("\nordered parallel map over 8 items, 3 at a time:");
    let squares = map_parallel(root, 1..=8_u64, 3, |_token, n| async move {
        // Later items finish first; the output is still in input order.
        tokio::time::sleep(Duration::from_millis(40 - n * 4)).await;
        Ok::<_, String>(n * n)
    })
    .await
    .expect("no failure");
    println!("{squares:?}");
}
