//! The start of the benches that need PostgreSQL and a broker (`outbox`, `consume`): their
//! arguments, the services' addresses, a pool.

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// What such a bench starts from.
pub(crate) struct Services {
    /// `--runs N` (default 3).
    pub(crate) runs: usize,
    pub(crate) pool: PgPool,
    pub(crate) brokers: String,
}

/// Reads `--runs`, and returns `None` (after saying how to run it) unless `cargo bench`
/// runs the bench: a bare `cargo test --benches` passes no `--bench` and must not need the
/// services. Exits with code 2 when `DATABASE_URL` or `KAFKA_BROKERS` is not set.
pub(crate) async fn connect(bench: &str, max_connections: u32) -> Option<Services> {
    let runs = std::env::args()
        .skip_while(|arg| arg != "--runs")
        .nth(1)
        .map_or(3, |n| n.parse().expect("--runs N"));
    if !std::env::args().any(|arg| arg == "--bench") {
        println!("{bench} bench: run with `cargo bench -p taskweave-benches --bench {bench}`");
        return None;
    }
    let (Ok(url), Ok(brokers)) = (
        std::env::var("DATABASE_URL"),
        std::env::var("KAFKA_BROKERS"),
    ) else {
        eprintln!(
            "the {bench} bench needs PostgreSQL and a broker: eval \"$(scripts/services start)\" first"
        );
        std::process::exit(2);
    };
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .connect(&url)
        .await
        .unwrap_or_else(|error| panic!("cannot reach PostgreSQL at {url}: {error}"));
    Some(Services {
        runs,
        pool,
        brokers,
    })
}
