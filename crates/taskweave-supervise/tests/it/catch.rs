//! `catch_panic`: panics become values with name, message, location and backtrace.

use std::backtrace::BacktraceStatus;

use taskweave_supervise::catch_panic;

use crate::support::LogCapture;

#[tokio::test]
async fn panic_becomes_an_error_with_message_location_and_backtrace() {
    let panic = catch_panic("exploder", async { panic!("worker exploded") })
        .await
        .unwrap_err();
    assert_eq!(panic.name(), "exploder");
    assert_eq!(panic.message(), "worker exploded");
    let location = panic.location().expect("the hook records the location");
    assert!(
        location.contains("tests/it/catch.rs"),
        "location was {location}"
    );
    assert_eq!(panic.backtrace().status(), BacktraceStatus::Captured);
    assert!(
        panic
            .to_string()
            .starts_with("task `exploder` panicked at "),
        "{panic}"
    );
    assert!(panic.to_string().ends_with(": worker exploded"), "{panic}");
}

#[tokio::test]
async fn formatted_and_non_string_payloads_are_reported() {
    let value = 7;
    let formatted = catch_panic("fmt", async move { panic!("bad value {value}") })
        .await
        .unwrap_err();
    assert_eq!(formatted.message(), "bad value 7");

    let opaque = catch_panic("opaque", async { std::panic::panic_any(42_u8) })
        .await
        .unwrap_err();
    assert_eq!(opaque.message(), "Box<dyn Any>");
}

#[tokio::test]
async fn a_panic_after_a_pending_poll_is_caught_too() {
    let panic = catch_panic("later", async {
        tokio::task::yield_now().await;
        panic!("second poll");
    })
    .await
    .unwrap_err();
    assert_eq!(panic.message(), "second poll");
}

#[tokio::test]
async fn panic_is_logged_at_error_level_with_name_and_backtrace() {
    let logs = LogCapture::global();
    let _ = catch_panic("logged-task", async { panic!("visible in logs") }).await;
    let text = logs.lines_with("task=logged-task");
    assert!(text.contains("ERROR"), "{text}");
    assert!(text.contains("task panicked"), "{text}");
    assert!(text.contains("task=logged-task"), "{text}");
    assert!(text.contains("panic=visible in logs"), "{text}");
    assert!(text.contains("backtrace="), "{text}");
}

#[tokio::test]
async fn nested_catch_keeps_the_outer_capture_working() {
    let outer = catch_panic("outer", async {
        let inner = catch_panic("inner", async { panic!("inner boom") }).await;
        assert_eq!(inner.unwrap_err().message(), "inner boom");
        panic!("outer boom");
    })
    .await
    .unwrap_err();
    assert_eq!(outer.message(), "outer boom");
    assert_eq!(outer.backtrace().status(), BacktraceStatus::Captured);
}

#[tokio::test]
async fn a_panic_caught_by_user_code_does_not_lend_its_site_to_a_later_one() {
    let caught = catch_panic("relay", async {
        // User code catches a panic of its own; its site is recorded but never consumed.
        let inner = std::panic::catch_unwind(|| panic!("inner, handled by the user"));
        // Then re-raises a different payload without the hook (`resume_unwind`).
        drop(inner);
        std::panic::resume_unwind(Box::new("re-raised elsewhere"));
    })
    .await
    .unwrap_err();
    assert_eq!(caught.message(), "re-raised elsewhere");
    assert_eq!(
        caught.location(),
        None,
        "the inner panic's site must not be used"
    );
    assert_eq!(caught.backtrace().status(), BacktraceStatus::Disabled);
}

#[tokio::test]
#[should_panic(expected = "`CatchPanic` polled after completion")]
async fn polling_after_completion_is_a_programmer_error() {
    let mut caught = Box::pin(catch_panic("once", async { 1 }));
    assert_eq!((&mut caught).await.unwrap(), 1);
    let _ = caught.await;
}

#[tokio::test]
async fn a_future_whose_destructor_panics_after_it_completed_is_caught() {
    let future = taskweave_testkit::ReadyThenPanicOnDrop::new("the future");
    let panic = catch_panic("destructor", future).await.unwrap_err();
    assert_eq!(panic.message(), "the future panicked in its Drop");
}

#[tokio::test]
async fn a_panic_payload_whose_drop_panics_does_not_unwind_out_of_the_catch() {
    let caught = catch_panic("payload", async {
        std::panic::panic_any(taskweave_testkit::PanicOnDrop("the payload"));
    })
    .await;
    assert_eq!(caught.unwrap_err().message(), "Box<dyn Any>");
}

// Issue 20: a `PanicError` keeps the original payload, to downcast or re-raise.
#[tokio::test]
async fn the_original_payload_can_be_downcast_or_re_raised() {
    #[derive(Debug, PartialEq)]
    struct Overdraft(u64);
    let panic = catch_panic("ledger", async { std::panic::panic_any(Overdraft(42)) })
        .without_logging()
        .await
        .unwrap_err();
    let copy = panic.clone();
    let payload = copy.take_payload().expect("the payload is kept");
    assert_eq!(*payload.downcast::<Overdraft>().unwrap(), Overdraft(42));
    // The clones share it: taken once. Re-raising then raises the message.
    assert!(panic.take_payload().is_none());
    let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| panic.resume_unwind()))
        .unwrap_err();
    assert_eq!(*again.downcast::<String>().unwrap(), "Box<dyn Any>");

    let disk = std::hint::black_box("full").to_owned();
    let panic = catch_panic("worker", async move { panic!("disk {disk}") })
        .without_logging()
        .await
        .unwrap_err();
    let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| panic.resume_unwind()))
        .unwrap_err();
    assert_eq!(*again.downcast::<String>().unwrap(), "disk full");
}

#[tokio::test]
async fn a_kept_payload_whose_drop_panics_is_dropped_without_unwinding() {
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("the payload's own Drop");
        }
    }
    let panic = catch_panic("job", async { std::panic::panic_any(Bomb) })
        .without_logging()
        .await
        .unwrap_err();
    assert_eq!(panic.message(), "Box<dyn Any>");
    // Dropping the error drops the payload inside a catch: this line does not unwind.
    drop(panic);
}

// Issue 20 (optional part): panics nobody catches reach the structured logs.
#[test]
fn log_panics_to_tracing_sends_uncaught_panics_to_tracing() {
    let logs = LogCapture::global();
    taskweave_supervise::log_panics_to_tracing();
    let thread = std::thread::Builder::new()
        .name("plain-thread-of-the-hook-test".into())
        .spawn(|| panic!("uncaught on a plain thread"))
        .unwrap();
    assert!(thread.join().is_err());
    let line = logs.lines_with("uncaught on a plain thread");
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("plain-thread-of-the-hook-test"), "{line}");
    assert!(line.contains("catch.rs"), "the location: {line}");
}

#[tokio::test]
async fn a_panic_the_future_catches_itself_is_logged_once_with_its_location() {
    let logs = LogCapture::global();
    let value = catch_panic("self-catcher", async {
        // Code inside the task catches a panic of its own (a library's catch_unwind, a
        // LocalSet's task): the hook's default report is left out while a catch_panic polls,
        // so the catch_panic reports it.
        let caught = std::panic::catch_unwind(|| panic!("caught inside"));
        assert!(caught.is_err());
        7
    })
    .await
    .expect("the task itself did not panic");
    assert_eq!(value, 7);
    let logged = logs.lines_with("self-catcher");
    assert!(
        logged.contains("a panic was caught inside the task") && logged.contains("caught inside"),
        "{logged}"
    );
    assert!(
        logged.contains("tests/it/catch.rs"),
        "with its location: {logged}"
    );
    assert_eq!(logged.lines().count(), 1, "once: {logged}");
}

/// A future that panics when polled, and again when dropped afterwards.
struct PanicsTwice;

impl std::future::Future for PanicsTwice {
    type Output = ();

    fn poll(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        panic!("first");
    }
}

impl Drop for PanicsTwice {
    fn drop(&mut self) {
        panic!("second, in drop");
    }
}

#[tokio::test]
async fn a_panic_whose_future_panics_again_when_dropped_keeps_its_own_location() {
    let logs = LogCapture::global();
    let panic = catch_panic("twice", PanicsTwice).await.unwrap_err();
    assert_eq!(panic.message(), "first");
    assert_site_in_this_file(&panic, "the first panic's own site");
    let logged = logs.lines_with("twice");
    assert!(
        logged.contains("dropping the panicked task's future panicked too")
            && logged.contains("second, in drop"),
        "{logged}"
    );
}

#[tokio::test]
async fn a_panic_unwinding_past_an_unfinished_inner_catch_keeps_its_location() {
    let logs = LogCapture::global();
    let panic = catch_panic("outer-owner", async {
        // Alive in the block when it panics: dropped by that unwind, unfinished.
        let _inner = Box::pin(catch_panic("inner-pending", std::future::pending::<()>()));
        tokio::task::yield_now().await;
        panic!("outer");
    })
    .await
    .unwrap_err();
    assert_eq!(panic.message(), "outer");
    assert_site_in_this_file(&panic, "the outer panic's own site");
    assert!(
        logs.lines_with("inner-pending").is_empty(),
        "nothing is reported under the inner task's name: {}",
        logs.lines_with("inner-pending")
    );
}

/// The panic was recorded at its own site, in this file.
#[track_caller]
fn assert_site_in_this_file(panic: &taskweave_supervise::PanicError, which: &str) {
    assert!(
        panic
            .location()
            .is_some_and(|at| at.contains("tests/it/catch.rs")),
        "{which}: {:?}",
        panic.location()
    );
}

/// Catches a panic of its own when dropped.
struct CatchesWhenDropped;

impl Drop for CatchesWhenDropped {
    fn drop(&mut self) {
        let caught = std::panic::catch_unwind(|| panic!("caught by a destructor mid-unwind"));
        assert!(caught.is_err());
    }
}

#[tokio::test]
async fn a_panic_a_destructor_catches_during_an_unwind_is_logged_and_leaves_the_first_alone() {
    let logs = LogCapture::global();
    let panic = catch_panic("unwinding-owner", async {
        let _guard = CatchesWhenDropped;
        tokio::task::yield_now().await;
        panic!("the task's own");
    })
    .await
    .unwrap_err();
    assert_eq!(panic.message(), "the task's own");
    assert_site_in_this_file(&panic, "the task's panic keeps its site");
    let logged = logs.lines_with("caught by a destructor mid-unwind");
    assert!(
        logged.contains("a panic while another unwound"),
        "the destructor's panic is reported: {logged}"
    );
}
