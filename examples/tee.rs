//! Tee: one stream of orders to an archive (lockstep: sees everything), a live dashboard
//! (drop-oldest: only the newest matter, and it says how many it missed) and a slow
//! analytics consumer (disconnected when it falls too far behind); none of them slows the
//! others beyond its policy.
//!
//! `cargo run --example tee`

#[path = "support.rs"]
mod support;

use std::time::Duration;

use futures::StreamExt;
use taskweave::tee::{Policy, tee_with};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    support::init_logging("warn");
    let orders = futures::stream::iter(1..=40_u32).then(|id| async move {
        tokio::time::sleep(Duration::from_millis(2)).await; // orders arrive over time
        format!("order-{id}")
    });
    let mut outputs = tee_with(
        CancellationToken::new(),
        orders,
        [
            Policy::lockstep(8),
            Policy::drop_oldest(4),
            Policy::disconnect(5),
        ],
    );
    let analytics = outputs.pop().unwrap();
    let dashboard = outputs.pop().unwrap();
    let archive = outputs.pop().unwrap();

    let archive = tokio::spawn(async move {
        let stored: Vec<String> = archive.collect().await;
        stored.len()
    });
    let dashboard = tokio::spawn(async move {
        let mut dashboard = dashboard;
        let mut shown = Vec::new();
        while let Some(order) = dashboard.next().await {
            shown.push(order);
            tokio::time::sleep(Duration::from_millis(10)).await; // redraws are slow
        }
        (shown, dashboard.lagged())
    });
    let analytics = tokio::spawn(async move {
        let mut analytics = analytics;
        let mut seen = 0;
        while analytics.next().await.is_some() {
            seen += 1;
            tokio::time::sleep(Duration::from_millis(50)).await; // a heavy query per order
        }
        (seen, analytics.is_disconnected())
    });

    println!(
        "archive (lockstep) stored {} of 40 orders",
        archive.await.unwrap()
    );
    let (shown, lagged) = dashboard.await.unwrap();
    println!(
        "dashboard (drop-oldest) drew {} orders, skipped {lagged} stale ones, last {:?}",
        shown.len(),
        shown.last()
    );
    let (seen, disconnected) = analytics.await.unwrap();
    println!("analytics (disconnect) handled {seen} orders, then disconnected: {disconnected}");
}
