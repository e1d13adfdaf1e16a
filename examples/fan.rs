//! Fan-in and fan-out: three feeds merged fairly, an expensive stage spread over four
//! copies, and `or_done` to leave an endless stream without `select!`.
//!
//! `cargo run --example fan`

#[path = "support.rs"]
mod support;

use std::time::Duration;

use futures::StreamExt;
use taskweave::fan::{fan_out, merge};
use taskweave::ordone::OrDoneExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    support::init_logging("warn");
    let root = CancellationToken::new();

    println!("== merge: a chatty feed does not starve the quiet ones ==");
    let chatty = futures::stream::iter((1..=6).map(|n| format!("chatty-{n}")));
    let quiet = futures::stream::iter(["quiet-1".to_string()]);
    let rare = futures::stream::iter(["rare-1".to_string(), "rare-2".to_string()]);
    let merged: Vec<String> = merge(root.clone(), [chatty.boxed(), quiet.boxed(), rare.boxed()])
        .collect()
        .await;
    println!("{merged:?}");

    println!("\n== fan_out: 12 slow lookups over 4 copies ==");
    let started = Instant::now();
    let mut found: Vec<(u32, u32)> = fan_out(
        root.clone(),
        futures::stream::iter(1..=12_u32),
        4,
        |id| async move {
            tokio::time::sleep(Duration::from_millis(50)).await; // a lookup
            (id, id * 7)
        },
    )
    .collect()
    .await;
    println!(
        "{} results in {:?} (one copy would need 600 ms); completion order: {:?}",
        found.len(),
        started.elapsed(),
        found.iter().map(|(id, _)| id).collect::<Vec<_>>()
    );
    found.sort_unstable();
    println!("sorted by id when order matters: {:?}", &found[..4]);

    println!("\n== or_done: leave an endless stream when the token fires ==");
    let token = root.child_token();
    let stopper = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(35)).await;
        stopper.cancel();
    });
    let mut heartbeats = futures::stream::unfold(0_u32, |n| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Some((n, n + 1))
    })
    .boxed()
    .or_done(token);
    while let Some(beat) = heartbeats.next().await {
        println!("heartbeat {beat}");
    }
    println!("stopped by the token, no select! in the loop");
}
