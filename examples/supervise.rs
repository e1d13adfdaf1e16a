//! Supervising long-lived tasks: a poller, a consumer restarted after failures, a panicking
//! job that does not take the process down, and a shutdown that reports what it left behind.

#[path = "support.rs"]
mod support;

use std::time::Duration;

use taskweave::supervise::{RestartPolicy, Supervisor};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    support::init_logging("warn");
    let root = CancellationToken::new();
    let supervisor = Supervisor::new(root.clone());

    // A poller: select on the token, like the seed's ticker loop.
    let token = supervisor.token();
    supervisor
        .spawn("poller", async move {
            let mut interval = tokio::time::interval(Duration::from_millis(100));
            let mut ticks = 0_u32;
            loop {
                tokio::select! {
                    () = token.cancelled() => {
                        println!("poller stopping after {ticks} ticks");
                        return;
                    }
                    _ = interval.tick() => ticks += 1,
                }
            }
        })
        .expect("open");

    // A consumer whose broker connection drops twice; restarted with backoff.
    let mut connects = 0;
    supervisor
        .spawn_restarting(
            "consumer",
            RestartPolicy::new(5, Duration::from_secs(30))
                .with_backoff(Duration::from_millis(50), Duration::from_secs(1)),
            move |token| {
                connects += 1;
                let connect = connects;
                async move {
                    if connect <= 2 {
                        return Err(format!("connection reset (connect {connect})"));
                    }
                    println!("consumer connected on attempt {connect}");
                    token.cancelled().await;
                    Ok(())
                }
            },
        )
        .expect("open");

    // A job that panics: logged with a backtrace, counted; the others keep running.
    let job = supervisor
        .spawn("import", async { panic!("malformed CSV line 42") })
        .expect("open");
    println!("import ended: {}", job.await.unwrap_err());

    // A job that ignores cancellation and will be aborted by the drain deadline.
    supervisor
        .spawn("stuck-upload", tokio::time::sleep(Duration::from_secs(30)))
        .expect("open");

    tokio::time::sleep(Duration::from_millis(400)).await;
    println!("running: {:?}", sorted(supervisor.running()));
    let report = supervisor.shutdown(Duration::from_millis(200)).await;
    println!("{report}");
    println!("{:?}", supervisor.metrics());
}

fn sorted(mut names: Vec<taskweave::supervise::TaskName>) -> Vec<taskweave::supervise::TaskName> {
    names.sort();
    names
}
