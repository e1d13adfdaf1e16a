//! Every exit path closes the output and ends the task: input end, cancel, consumer drop,
//! panic.

use std::time::Duration;

use futures::stream::FusedStream;
use futures::{Stream, StreamExt};
use taskweave_pipeline::{Pipeline, PipelineExt, StageEnd};
use tokio_util::sync::CancellationToken;

use crate::{alive_tasks, assert_no_leaked_tasks};

#[tokio::test]
async fn input_end_closes_every_output() {
    let baseline = alive_tasks();
    let p = Pipeline::new(CancellationToken::new());
    let mut out = p.iter(0..3).spawn_map(&p, |n| async move { n });
    assert_eq!((&mut out).collect::<Vec<_>>().await, [0, 1, 2]);
    assert!(out.is_terminated());
    assert_eq!(out.size_hint(), (0, Some(0)));
    assert!(matches!(out.end(), Some(StageEnd::InputEnded)));
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn cancel_stops_stages_waiting_to_send_or_inside_their_function() {
    let baseline = alive_tasks();
    let token = CancellationToken::new();
    let p = Pipeline::new(token.clone()).with_capacity(2);
    // The source fills its output and waits to send; the map sits in a call that never ends.
    let mut out = p.repeat([1_u8]).spawn_map(&p, |n| async move {
        if n == 1 {
            std::future::pending::<()>().await;
        }
        n
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    token.cancel();
    assert_eq!(out.next().await, None);
    assert!(matches!(out.end(), Some(StageEnd::Cancelled)));
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn cancel_still_hands_over_what_was_already_buffered_then_ends() {
    let token = CancellationToken::new();
    let p = Pipeline::new(token.clone()).with_capacity(3);
    let mut out = p.repeat([7_u8]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    token.cancel();
    let rest: Vec<u8> = (&mut out).collect().await;
    assert_eq!(rest, [7, 7, 7], "the full buffer, then the end");
}

#[tokio::test(start_paused = true)]
async fn dropping_the_last_output_stops_every_stage_upstream() {
    let baseline = alive_tasks();
    let p = Pipeline::new(CancellationToken::new()).with_capacity(1);
    // Upstream: an endless source, waiting to send; a stage that waits on input that never
    // comes is stopped too.
    let out = p
        .repeat([1_u32])
        .spawn_map(&p, |n| async move { n + 1 })
        .spawn_filter(&p, |_| true);
    let idle = p
        .stream(futures::stream::pending::<u8>())
        .spawn_map(&p, |n| async move { n });
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(!p.token().is_cancelled());
    drop(out);
    drop(idle);
    assert_no_leaked_tasks(baseline).await;
    assert!(
        !p.token().is_cancelled(),
        "only the dropped stages' own tokens"
    );
}

#[tokio::test(start_paused = true)]
async fn a_panic_ends_the_stage_early_and_every_stage_downstream_reports_it() {
    let baseline = alive_tasks();
    let p = Pipeline::new(CancellationToken::new());
    let mut out = p
        .iter(0..10_u32)
        .spawn_map(&p.named("checked"), |n| async move {
            assert!(n != 3, "item {n} is cursed");
            n
        })
        .spawn_filter(&p.named("all"), |_| true)
        .spawn_map(&p.named("last"), |n| async move { n * 2 });
    let items: Vec<u32> = (&mut out).collect().await;
    assert_eq!(items, [0, 2, 4], "the items before the panic, then the end");
    let panic = out
        .end()
        .and_then(StageEnd::panic)
        .expect("reported downstream");
    assert_eq!(panic.name(), "checked");
    assert_eq!(panic.message(), "item 3 is cursed");
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test]
async fn a_panic_in_a_filter_predicate_or_a_source_is_reported_too() {
    let p = Pipeline::new(CancellationToken::new());
    let mut filtered = p.iter(0..5).spawn_filter(&p.named("picky"), |n| {
        assert!(*n < 2, "too big");
        true
    });
    assert_eq!((&mut filtered).collect::<Vec<_>>().await, [0, 1]);
    assert_eq!(
        filtered.end().and_then(StageEnd::panic).unwrap().name(),
        "picky"
    );

    let mut source = p.named("gen").unfold(0_u8, |n| async move {
        assert!(n < 1, "source broke");
        Some((n, n + 1))
    });
    assert_eq!((&mut source).collect::<Vec<_>>().await, [0]);
    let panic = source.end().and_then(StageEnd::panic).unwrap();
    assert_eq!(
        (panic.name().as_ref(), panic.message()),
        ("gen", "source broke")
    );
}

#[tokio::test]
async fn a_consumer_outside_a_stage_reads_the_panic_from_end_not_from_a_log() {
    let p = Pipeline::new(CancellationToken::new());
    let mut out = p
        .iter([1])
        .spawn_map(&p, |_: i32| async { panic!("boom") })
        .first(10);
    assert_eq!(out.next().await, None::<i32>);
    let stage = out.get_ref().unwrap();
    assert_eq!(
        stage.end().and_then(StageEnd::panic).unwrap().name(),
        "pipeline-map"
    );
}

#[tokio::test]
async fn an_upstream_panic_is_reported_through_adapters_between_stages() {
    let p = Pipeline::new(CancellationToken::new());
    let broken = p
        .iter(0..5)
        .spawn_map(&p.named("broken"), |n: i32| async move {
            assert!(n < 1, "broken at {n}");
            n
        });
    // futures adapters and a chain between two stages: still the stage's input.
    let input = broken.map(|n| n + 1).chain(futures::stream::iter([100]));
    let mut out = input.spawn_filter(&p.named("after"), |_| true);
    assert_eq!((&mut out).collect::<Vec<_>>().await, [1, 100]);
    match out.end() {
        Some(StageEnd::UpstreamPanicked(panic)) => assert_eq!(panic.name(), "broken"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_stage_read_inside_a_function_is_not_mistaken_for_the_input() {
    let p = Pipeline::new(CancellationToken::new());
    let inner = p.clone();
    let mut out = p.iter([1, 2]).spawn_map(&p.named("outer"), move |n: i32| {
        let inner = inner.clone();
        async move {
            // A sub-pipeline that panics, read (and its end ignored) inside the function.
            let sub = inner
                .iter([n])
                .spawn_map(&inner.named("sub"), |_: i32| async { panic!("sub failed") });
            sub.count().await
        }
    });
    assert_eq!((&mut out).collect::<Vec<_>>().await, [0, 0]);
    assert!(
        matches!(out.end(), Some(StageEnd::InputEnded)),
        "{:?}",
        out.end()
    );
}

#[tokio::test]
async fn a_consumer_that_checks_is_terminated_first_still_passes_the_panic_on() {
    let p = Pipeline::new(CancellationToken::new());
    let mut broken = p
        .iter([1])
        .spawn_map(&p.named("broken"), |_: i32| async { panic!("no") });
    // As `select!` does: poll only while not terminated.
    let mut got = Vec::new();
    while !broken.is_terminated() {
        if let Some(n) = broken.next().await {
            got.push(n);
        }
    }
    assert!(got.is_empty());
    assert!(matches!(broken.end(), Some(StageEnd::Panicked(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panics_are_reported_downstream_on_the_multi_thread_runtime() {
    for _ in 0..20 {
        let p = Pipeline::new(CancellationToken::new());
        let mut out = p
            .iter(0..100_u32)
            .spawn_map(&p.named("broken"), |n| async move {
                assert!(n < 50, "broken at {n}");
                n
            })
            .spawn_map(&p.named("next"), |n| async move { n });
        assert_eq!((&mut out).count().await, 50);
        assert_eq!(
            out.end().and_then(StageEnd::panic).unwrap().name(),
            "broken"
        );
    }
}
