//! Reordering: thumbnails rendered 4 at a time and uploaded in page order with
//! `map_ordered` (a render that panics becomes an error in its place), and the reorder
//! buffer putting out-of-order network chunks back together.
//!
//! `cargo run --example reorder`

#[path = "support.rs"]
mod support;

use std::time::Duration;

use futures::StreamExt;
use taskweave::reorder::{ReorderBuffer, map_ordered};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    support::init_logging("error");

    println!("== map_ordered: render 12 pages 4 at a time, upload in page order ==");
    let started = Instant::now();
    let pages = futures::stream::iter(1..=12_u64);
    let mut rendered = map_ordered(CancellationToken::new(), pages, 4, |page| async move {
        // Odd pages are slow to render; page 7 is corrupt.
        tokio::time::sleep(Duration::from_millis(if page % 2 == 1 { 60 } else { 10 })).await;
        assert!(page != 7, "page {page}: corrupt image");
        format!("thumb-{page}.png")
    });
    let mut order = Vec::new();
    while let Some(result) = rendered.next().await {
        match result {
            Ok(thumb) => order.push(thumb),
            Err(panic) => order.push(format!("<{}>", panic.message())),
        }
        // The upload takes a while; the renders go on meanwhile (`buffered(4)` would wait).
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("{order:?}");
    println!(
        "in {:?} (one at a time: 480 ms, 420 of rendering and 60 of uploading)",
        started.elapsed()
    );

    println!("\n== ReorderBuffer: chunks arrive out of order ==");
    let mut buffer = ReorderBuffer::new(4);
    let mut message = String::new();
    for (index, chunk) in [(1, "lo, "), (0, "hel"), (3, "ld"), (2, "wor")] {
        buffer
            .push(index, chunk)
            .expect("within the window, once each");
        while let Some(next) = buffer.pop() {
            message.push_str(next);
        }
        println!(
            "after chunk {index}: {message:?} (waiting: {})",
            buffer.len()
        );
    }
    match buffer.push(9, "!") {
        Err(error) => println!("chunk 9: {error}; hold it until the window moves on"),
        Ok(()) => println!("chunk 9 buffered"),
    }
}
