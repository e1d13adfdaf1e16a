//! The sequence on the paused clock: readiness, budget split, overruns, panics, critical
//! sections, resources in reverse order.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskweave_shutdown::{Shutdown, StepKind, StepStatus, Trigger};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{alive_tasks, assert_no_leaked_tasks};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[tokio::test(start_paused = true)]
async fn unused_time_rolls_forward_to_the_next_phase() {
    let shutdown = Shutdown::new(CancellationToken::new(), secs(12));
    for (name, took) in [("a", 1), ("b", 2), ("c", 0)] {
        shutdown.phase(name, move |_ctx| async move {
            tokio::time::sleep(secs(took)).await
        });
    }
    let report = shutdown.run_now("test").await;
    let granted: Vec<Duration> = report.steps[1..4].iter().map(|s| s.granted).collect();
    // 12 s over 3: a gets 4 and uses 1; b gets half of 11; c gets all of the 9 left.
    assert_eq!(granted, [secs(4), Duration::from_millis(5_500), secs(9)]);
    assert!(report.is_clean());
    assert_eq!(report.elapsed, secs(3));
}

#[tokio::test(start_paused = true)]
async fn weights_and_resources_take_their_shares() {
    let shutdown = Shutdown::new(CancellationToken::new(), secs(10));
    shutdown.phase_weighted("big", 3, |_ctx| async {});
    shutdown.phase("small", |_ctx| async {});
    shutdown.resource("db", |_ctx| async {});
    let report = shutdown.run_now("test").await;
    assert_eq!(
        report.step("big").unwrap().granted,
        secs(6),
        "3 of 5 shares"
    );
    assert_eq!(
        report.step("small").unwrap().granted,
        secs(5),
        "1 of 2 shares of what is left"
    );
    assert_eq!(
        report.step("db").unwrap().granted,
        secs(10),
        "the resources get the rest"
    );
}

#[tokio::test(start_paused = true)]
async fn an_overrunning_phase_is_cut_off_and_the_next_runs_with_what_remains() {
    let baseline = alive_tasks();
    let shutdown = Shutdown::new(CancellationToken::new(), secs(10));
    let saw_cancel = Arc::new(Mutex::new(false));
    let saw = Arc::clone(&saw_cancel);
    shutdown.phase("stuck consumer", move |ctx| async move {
        ctx.abandon("partition 7 not committed");
        ctx.token().cancelled().await;
        *saw.lock().unwrap() = true;
        std::future::pending::<()>().await; // ignores its token too
    });
    shutdown.phase("flush", |ctx| async move {
        // All of the 5 s left; told to wind down 90 % in.
        assert_eq!(ctx.remaining(), Duration::from_millis(4_500));
    });
    let started = Instant::now();
    let report = shutdown.run_now("test").await;
    let stuck = report.step("stuck consumer").unwrap();
    assert!(matches!(stuck.status, StepStatus::TimedOut));
    assert_eq!((stuck.granted, stuck.elapsed), (secs(5), secs(5)));
    assert_eq!(
        stuck.abandoned,
        ["partition 7 not committed", "cut off at its deadline"]
    );
    assert!(
        *saw_cancel.lock().unwrap(),
        "its token was cancelled at the deadline"
    );
    assert!(report.step("flush").unwrap().status.is_completed());
    assert!(started.elapsed() <= secs(10));
    assert!(!report.is_clean());
    assert_no_leaked_tasks(baseline).await;
}

#[tokio::test(start_paused = true)]
async fn a_phase_that_uses_the_whole_budget_leaves_the_rest_skipped() {
    let shutdown = Shutdown::new(CancellationToken::new(), secs(4));
    shutdown.phase_weighted("greedy", 100, |_ctx| std::future::pending::<()>());
    shutdown.resource("db", |_ctx| async {});
    // The greedy phase holds 100 of 101 shares; the resource gets its one share.
    let report = shutdown.run_now("test").await;
    assert!(matches!(
        report.step("greedy").unwrap().status,
        StepStatus::TimedOut
    ));
    assert!(report.step("db").unwrap().status.is_completed());

    let shutdown = Shutdown::new(CancellationToken::new(), secs(4));
    let open = shutdown.critical_section("endless batch").unwrap();
    shutdown.resource("db", |_ctx| async {});
    let report = shutdown.run_now("test").await;
    let critical = report.step("critical sections").unwrap();
    assert!(matches!(critical.status, StepStatus::TimedOut));
    assert_eq!(
        critical.abandoned,
        ["still open at the hard deadline: endless batch"]
    );
    let db = report.step("db").unwrap();
    assert!(matches!(db.status, StepStatus::Skipped));
    assert_eq!(db.abandoned, ["not run: no budget left"]);
    assert_eq!(report.elapsed, secs(4), "never past the budget");
    drop(open);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_phase_is_reported_and_the_others_still_run_in_order() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let shutdown = Shutdown::new(CancellationToken::new(), secs(10));
    for name in ["first", "exploding", "last"] {
        let order = Arc::clone(&order);
        shutdown.phase(name, move |_ctx| async move {
            order.lock().unwrap().push(name);
            assert!(name != "exploding", "phase {name} failed");
        });
    }
    let report = shutdown.run_now("test").await;
    assert_eq!(*order.lock().unwrap(), ["first", "exploding", "last"]);
    match &report.step("exploding").unwrap().status {
        StepStatus::Panicked(panic) => assert_eq!(panic.message(), "phase exploding failed"),
        other => panic!("{other:?}"),
    }
    assert!(report.step("last").unwrap().status.is_completed());
}

#[tokio::test(start_paused = true)]
async fn resources_close_last_in_reverse_order_of_opening() {
    let closed = Arc::new(Mutex::new(Vec::new()));
    let shutdown = Shutdown::new(CancellationToken::new(), secs(10));
    for name in ["config", "database", "cache"] {
        let closed = Arc::clone(&closed);
        shutdown.resource(name, move |_ctx| async move {
            closed.lock().unwrap().push(name)
        });
    }
    let c = Arc::clone(&closed);
    shutdown.phase("workers", move |_ctx| async move {
        c.lock().unwrap().push("workers")
    });
    let report = shutdown.run_now("test").await;
    assert_eq!(
        *closed.lock().unwrap(),
        ["workers", "cache", "database", "config"]
    );
    let kinds: Vec<StepKind> = report.steps.iter().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        [
            StepKind::Readiness,
            StepKind::Phase,
            StepKind::CriticalSections,
            StepKind::Resource,
            StepKind::Resource,
            StepKind::Resource
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_critical_section_is_waited_for_before_the_resources_close() {
    let events = Arc::new(Mutex::new(Vec::new()));
    let shutdown = Shutdown::new(CancellationToken::new(), secs(10));
    let commit = shutdown.critical_section("commit").unwrap();
    let e = Arc::clone(&events);
    tokio::spawn(async move {
        tokio::time::sleep(secs(3)).await;
        e.lock().unwrap().push("committed");
        drop(commit);
    });
    let e = Arc::clone(&events);
    shutdown.resource("database", move |_ctx| async move {
        e.lock().unwrap().push("database closed")
    });
    let report = shutdown.run_now("test").await;
    assert_eq!(*events.lock().unwrap(), ["committed", "database closed"]);
    let critical = report.step("critical sections").unwrap();
    assert!(critical.status.is_completed());
    assert_eq!(critical.elapsed, secs(3));
}

#[tokio::test(start_paused = true)]
async fn readiness_flips_first_and_the_service_keeps_serving_for_the_delay() {
    let shutdown = Shutdown::new(CancellationToken::new(), secs(10)).with_readiness_delay(secs(5));
    let readiness = shutdown.readiness();
    let phase_started = Arc::new(Mutex::new(None));
    let p = Arc::clone(&phase_started);
    shutdown.phase("http drain", move |_ctx| async move {
        *p.lock().unwrap() = Some(Instant::now())
    });
    assert!(readiness.is_ready());
    let run = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { shutdown.run().await }
    });
    let triggered = Instant::now();
    assert!(shutdown.trigger("deploy"));
    assert!(
        !readiness.is_ready(),
        "not ready at once, before `run` is even polled"
    );
    assert_eq!(readiness.probe().0, 503);
    assert!(!shutdown.trigger("again"), "only the first trigger counts");
    tokio::time::sleep(secs(1)).await;
    assert!(
        phase_started.lock().unwrap().is_none(),
        "still serving during the delay"
    );
    let report = run.await.unwrap();
    assert_eq!(phase_started.lock().unwrap().unwrap() - triggered, secs(5));
    assert_eq!(report.trigger, Trigger::Requested("deploy".into()));
    assert_eq!(report.steps[0].name, "readiness delay");
    assert_eq!(report.steps[0].elapsed, secs(5));
    assert_eq!(
        report.step("http drain").unwrap().granted,
        secs(10),
        "the delay is not taken from the budget"
    );
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_token_elsewhere_starts_it_too() {
    let token = CancellationToken::new();
    let shutdown = Shutdown::new(token.clone(), secs(1));
    token.cancel();
    assert!(shutdown.is_triggered());
    assert!(!shutdown.trigger("late"));
    let report = shutdown.run().await;
    assert_eq!(report.trigger, Trigger::TokenCancelled);
}

#[tokio::test(start_paused = true)]
async fn the_report_so_far_shows_the_running_step_as_interrupted() {
    let shutdown = Shutdown::new(CancellationToken::new(), secs(10));
    shutdown.phase("done quickly", |_ctx| async {});
    shutdown.phase("slow", |_ctx| tokio::time::sleep(secs(3)));
    let run = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { shutdown.run_now("test").await }
    });
    tokio::time::sleep(secs(1)).await;
    let so_far = shutdown.report_so_far();
    assert!(!so_far.complete);
    let names: Vec<(&str, String)> = so_far
        .steps
        .iter()
        .map(|s| (s.name.as_str(), s.status.to_string()))
        .collect();
    assert_eq!(
        names,
        [
            ("readiness delay", "completed".to_string()),
            ("done quickly", "completed".to_string()),
            ("slow", "interrupted".to_string())
        ]
    );
    assert!(so_far.to_string().contains("cut short by a second signal"));
    assert!(run.await.unwrap().is_clean());
}

#[test]
#[should_panic(expected = "Shutdown::new: the budget must be greater than zero")]
fn a_zero_budget_panics() {
    let _ = Shutdown::new(CancellationToken::new(), Duration::ZERO);
}

#[test]
#[should_panic(expected = "Shutdown::phase_weighted: the weight must be greater than zero")]
fn a_zero_weight_panics() {
    Shutdown::new(CancellationToken::new(), secs(1)).phase_weighted("x", 0, |_ctx| async {});
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_the_closure_itself_is_caught_too() {
    let shutdown = Shutdown::new(CancellationToken::new(), secs(4));
    shutdown.phase("eager", |_ctx| -> std::future::Ready<()> {
        panic!("before any await")
    });
    shutdown.phase("after", |_ctx| async {});
    let report = shutdown.run_now("test").await;
    assert_eq!(
        report
            .step("eager")
            .unwrap()
            .status
            .panic()
            .unwrap()
            .message(),
        "before any await"
    );
    assert!(report.step("after").unwrap().status.is_completed());
}

#[tokio::test(start_paused = true)]
async fn a_step_that_stops_when_told_completes_with_a_note() {
    let shutdown = Shutdown::new(CancellationToken::new(), secs(10));
    shutdown.phase(
        "consumer",
        |ctx| async move { ctx.token().cancelled().await },
    );
    let report = shutdown.run_now("test").await;
    let consumer = report.step("consumer").unwrap();
    assert!(consumer.status.is_completed());
    assert_eq!(consumer.elapsed, secs(9), "told at 90 % of its 10 s");
    assert_eq!(consumer.abandoned, ["finished after its deadline"]);
}

#[tokio::test(start_paused = true)]
async fn a_phase_inside_a_critical_section_is_not_cut_in_half() {
    let shutdown = Shutdown::new(CancellationToken::new(), secs(10));
    shutdown.phase("batch", |ctx| async move {
        let _commit = ctx.critical_section("commit").unwrap();
        tokio::time::sleep(secs(7)).await; // past its 5 s grant
    });
    shutdown.phase("next", |_ctx| async {});
    let report = shutdown.run_now("test").await;
    let batch = report.step("batch").unwrap();
    assert!(batch.status.is_completed(), "{:?}", batch.status);
    assert_eq!((batch.granted, batch.elapsed), (secs(5), secs(7)));
    assert_eq!(
        report.step("next").unwrap().granted,
        secs(3),
        "what is left"
    );
}

#[tokio::test(start_paused = true)]
async fn no_critical_section_starts_once_the_resources_close() {
    let shutdown = Shutdown::new(CancellationToken::new(), secs(2));
    let inner = shutdown.clone();
    let refused = Arc::new(Mutex::new(None));
    let r = Arc::clone(&refused);
    shutdown.resource("db", move |_ctx| async move {
        *r.lock().unwrap() = Some(inner.critical_section("late commit").is_none());
    });
    assert!(shutdown.critical_section("early").is_some());
    let _ = shutdown.run_now("test").await;
    assert_eq!(*refused.lock().unwrap(), Some(true));
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "Shutdown::run: the shutdown runs once")]
async fn running_twice_panics() {
    let shutdown = Shutdown::new(CancellationToken::new(), secs(1));
    let _ = shutdown.run_now("first").await;
    let _ = shutdown.run().await;
}

#[tokio::test(start_paused = true)]
async fn a_phase_registered_after_the_start_is_refused() {
    let shutdown = Shutdown::new(CancellationToken::new(), secs(1));
    assert!(shutdown.phase("on time", |_ctx| async {}));
    let report = shutdown.run_now("test").await;
    assert!(!shutdown.phase("late", |_ctx| async {}));
    assert!(!shutdown.resource("late", |_ctx| async {}));
    assert!(report.step("late").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_components_critical_section_does_not_hold_a_phase_back() {
    let shutdown = Shutdown::new(CancellationToken::new(), secs(10));
    let export = shutdown.critical_section("export").unwrap();
    tokio::spawn(async move {
        tokio::time::sleep(secs(8)).await;
        drop(export);
    });
    shutdown.phase("stuck", |_ctx| std::future::pending::<()>());
    shutdown.phase("next", |_ctx| async {});
    let report = shutdown.run_now("test").await;
    let stuck = report.step("stuck").unwrap();
    assert!(stuck.status.is_timed_out());
    assert_eq!(stuck.elapsed, secs(5), "cut off at the end of its grant");
    assert!(report.step("next").unwrap().status.is_completed());
    let critical = report.step("critical sections").unwrap();
    assert!(
        critical.status.is_completed(),
        "the export was waited for there"
    );
    assert_eq!(report.elapsed, secs(8));
}

#[tokio::test(start_paused = true)]
async fn a_step_past_its_grant_cannot_open_a_section() {
    let shutdown = Shutdown::new(CancellationToken::new(), secs(10));
    let refused = Arc::new(Mutex::new(None));
    let r = Arc::clone(&refused);
    shutdown.phase("late", move |ctx| async move {
        let first = ctx.critical_section("first").unwrap();
        tokio::time::sleep(secs(7)).await; // past its 5 s grant
        drop(first);
        *r.lock().unwrap() = Some(ctx.critical_section("again").is_none());
    });
    shutdown.phase("next", |_ctx| async {}); // so that `late` gets half the budget
    let report = shutdown.run_now("test").await;
    assert_eq!(
        *refused.lock().unwrap(),
        Some(true),
        "no new section past the grant"
    );
    let late = report.step("late").unwrap();
    assert!(late.status.is_completed(), "{:?}", late.status);
    assert_eq!(late.elapsed, secs(7));
}
