//! The seed's pipeline: squares of 1..=5, odd ones only, the consumer stops after 9.

use futures::StreamExt;
use taskweave_pipeline::{Pipeline, PipelineExt, StageEnd};
use tokio_util::sync::CancellationToken;

use crate::{alive_tasks, assert_no_leaked_tasks};

async fn squares_of_odd_then_cancel_after_eight() -> Vec<u64> {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let p = Pipeline::new(token.clone());
    let mut odd = p
        .iter(1..=5_u64)
        .spawn_map(&p.named("square"), |n| async move { n * n })
        .spawn_filter(&p.named("odd"), |n| n % 2 == 1);
    assert_eq!(odd.name(), "odd");
    let mut seen = Vec::new();
    while let Some(v) = odd.next().await {
        seen.push(v);
        if v > 8 {
            token.cancel();
            break;
        }
    }
    // The consumer keeps its stream: the stages stop because of the token alone.
    assert_no_leaked_tasks(baseline).await;
    // Depending on how far the stages ran ahead, the last one finished because its input
    // ended or because of the token; either way it has finished.
    assert!(
        matches!(odd.end(), Some(StageEnd::Cancelled | StageEnd::InputEnded)),
        "{:?}",
        odd.end()
    );
    seen
}

#[tokio::test]
async fn the_consumer_sees_exactly_1_and_9_and_every_stage_exits() {
    assert_eq!(squares_of_odd_then_cancel_after_eight().await, [1, 9]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_holds_on_the_multi_thread_runtime() {
    for _ in 0..50 {
        assert_eq!(squares_of_odd_then_cancel_after_eight().await, [1, 9]);
    }
}

#[tokio::test]
async fn without_cancel_the_pipeline_yields_every_odd_square_and_ends() {
    let p = Pipeline::new(CancellationToken::new());
    let mut odd = p
        .iter(1..=5_u64)
        .spawn_map(&p, |n| async move { n * n })
        .spawn_filter(&p, |n| n % 2 == 1);
    let mut seen = Vec::new();
    while let Some(v) = odd.next().await {
        seen.push(v);
    }
    assert_eq!(seen, [1, 9, 25]);
    assert!(matches!(odd.end(), Some(StageEnd::InputEnded)));
    assert_eq!(
        odd.name(),
        "pipeline-filter",
        "named after its kind by default"
    );
}
