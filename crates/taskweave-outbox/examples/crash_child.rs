//! A relay process for the crash tests (`tests/it/crash.rs`): it relays one outbox to a
//! topic and, at the named point of its first batch, prints `REACHED` and waits there to be
//! killed with SIGKILL. Built only with the `test-hooks` feature; not an example to copy.
//!
//! Environment: `DATABASE_URL`, `OUTBOX_SCHEMA`, `KAFKA_BROKERS`, and `CRASH_POINT`
//! (`before-publish`, `after-acks` or `after-commit`).

use std::io::Write;

use futures::FutureExt;
use taskweave_outbox::hooks::Point;
use taskweave_outbox::{KafkaPublisher, PgStore, Relay, Schema};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let point = match var("CRASH_POINT").as_str() {
        "before-publish" => Point::BeforePublish,
        "after-acks" => Point::AfterAcks,
        "after-commit" => Point::AfterCommit,
        other => panic!("unknown CRASH_POINT {other}"),
    };
    let pool = sqlx::PgPool::connect(&var("DATABASE_URL"))
        .await
        .expect("database");
    let store = PgStore::connect(pool, Schema::new(&var("OUTBOX_SCHEMA")))
        .await
        .expect("outbox");
    let publisher = KafkaPublisher::new(&var("KAFKA_BROKERS")).expect("producer");
    let relay = Relay::new(store, publisher)
        .with_batch_size(10)
        .with_hook(move |at| {
            if at == point {
                println!("REACHED");
                std::io::stdout().flush().expect("stdout");
                return futures::future::pending().boxed();
            }
            futures::future::ready(()).boxed()
        });
    relay.run(CancellationToken::new()).await;
}
