//! Pipelines: the seed's squares with an early cancel, a `try_map` pipeline where one record
//! in the middle is bad, and a panicking stage that is reported, not lost.
//!
//! `cargo run --example pipeline`

#[path = "support.rs"]
mod support;

use futures::StreamExt;
use taskweave::pipeline::{Pipeline, PipelineExt, StageEnd};
use tokio_util::sync::CancellationToken;

#[derive(Debug)]
struct Order {
    id: u32,
    cents: u64,
}

#[tokio::main]
async fn main() {
    support::init_logging("error");

    println!("== squares of 1..=5, odd ones only, stop after a value > 8 ==");
    let token = CancellationToken::new();
    let p = Pipeline::new(token.clone());
    let mut odd_squares = p
        .iter(1..=5_u64)
        .spawn_map(&p.named("square"), |n| async move { n * n })
        .spawn_filter(&p.named("odd"), |n| n % 2 == 1);
    while let Some(v) = odd_squares.next().await {
        println!("{v}");
        if v > 8 {
            token.cancel(); // every stage stops and closes its output
            break;
        }
    }

    println!("\n== parse → price → total, with a bad record in the middle ==");
    let p = Pipeline::new(CancellationToken::new()).with_capacity(4);
    let lines = ["1,1250", "2,oops", "3,399", "4,10000"];
    let mut results = p
        .iter(lines)
        .spawn_map(&p.named("parse"), |line: &str| async move {
            let (id, cents) = line
                .split_once(',')
                .ok_or(format!("no comma in {line:?}"))?;
            let id: u32 = id.parse().map_err(|e| format!("bad id in {line:?}: {e}"))?;
            let cents = cents
                .parse()
                .map_err(|e| format!("bad amount in {line:?}: {e}"))?;
            Ok(Order { id, cents })
        })
        .spawn_try_map(&p.named("tax"), |order: Order| async move {
            // Applied to the good records only; the bad one passes through untouched.
            Ok::<_, String>(Order {
                cents: order.cents * 120 / 100,
                ..order
            })
        });
    let mut total = 0;
    while let Some(result) = results.next().await {
        match result {
            Ok(order) => {
                println!("order {} with tax: {} cents", order.id, order.cents);
                total += order.cents;
            }
            Err(error) => println!("skipped: {error}"),
        }
    }
    println!("total: {total} cents");

    println!("\n== a stage that panics ends the pipeline early and says so ==");
    let p = Pipeline::new(CancellationToken::new());
    let mut out = p
        .iter(1..=5_u32)
        .spawn_map(&p.named("divide"), |n| async move { 100 / (3 - n) })
        .spawn_map(&p.named("format"), |n| async move { format!("={n}") });
    while let Some(line) = out.next().await {
        println!("{line}");
    }
    // The last stage ends because the one before it panicked; `panic()` covers both.
    match out.end().and_then(StageEnd::panic) {
        Some(panic) => {
            println!(
                "ended early: stage {:?} panicked: {}",
                panic.name(),
                panic.message()
            );
        }
        None => println!("ended: {:?}", out.end()),
    }
}
