//! `catch_panic`: a future adapter that turns a panic into a `PanicError` with a backtrace.

use std::backtrace::Backtrace;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, PanicHookInfo};
use std::pin::Pin;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use crate::{PanicError, TaskName};

/// Wraps `future` so that a panic while polling it resolves to `Err(PanicError)` instead of
/// unwinding into the caller.
///
/// The panic is logged through `tracing` at error level with the name, message, location and
/// backtrace, so it is never silent even if the error is ignored. This runs the future inline
/// in the caller's task; [`spawn`](crate::spawn) uses it to run the future on its own task.
///
/// # How the backtrace is captured
///
/// `catch_unwind` only sees the payload, after the stack has unwound. On first use this crate
/// installs a process-wide panic hook that, for panics raised while a `CatchPanic` is being
/// polled on the current thread, records the message, location and a backtrace for the
/// catching future. It stays quiet when a `tracing` subscriber takes error events here (the
/// event replaces the default "thread panicked" message), and otherwise also calls the hook
/// that was installed before, so a panic is never silent, with or without a subscriber (and
/// always under `panic = "abort"`, where nothing can be caught). Panics anywhere else go to the
/// previous hook unchanged.
///
/// The recorded site is used only if its message matches the caught payload, so a panic caught
/// by user code inside the future cannot lend its site to a later one. The backtrace is
/// `Disabled` when the site could not be observed: the panic was re-raised with
/// `resume_unwind` (which skips hooks), or a hook installed later by the application replaced
/// ours.
///
/// # Examples
///
/// ```
/// use taskweave_supervise::catch_panic;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let ok = catch_panic("adder", async { 2 + 2 }).await;
/// assert_eq!(ok.unwrap(), 4);
///
/// let caught = catch_panic("exploder", async { panic!("worker exploded") }).await;
/// let panic = caught.unwrap_err();
/// assert_eq!(panic.name(), "exploder");
/// assert_eq!(panic.message(), "worker exploded");
/// # }
/// ```
///
/// # Cancel safety
///
/// Dropping the returned future drops `future`; it is exactly as cancel safe as `future`.
pub fn catch_panic<F>(name: impl Into<TaskName>, future: F) -> CatchPanic<F>
where
    F: Future,
{
    install_hook();
    CatchPanic {
        name: name.into(),
        log: true,
        stage: Stage::Running { future },
    }
}

pin_project! {
    /// Future returned by [`catch_panic`]; see there for an example.
    ///
    /// The inner future is dropped inside the catch as soon as it completes or panics, so a
    /// panic in its destructor is caught too (reported as the panic, the output lost). An
    /// unfinished future dropped with the `CatchPanic` (an aborted task) is dropped inside a
    /// catch as well: a panic of its destructor is logged, and the drop (the abort) goes on.
    ///
    /// A panic that code inside the future catches itself (a `catch_unwind`, a `LocalSet`'s
    /// task) is logged once at the end of the poll, since the default report of the panic
    /// hook is left out while a `catch_panic` polls.
    #[must_use = "futures do nothing unless polled"]
    pub struct CatchPanic<F> {
        name: TaskName,
        log: bool,
        #[pin]
        stage: Stage<F>,
    }

    impl<F> PinnedDrop for CatchPanic<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let mut stage = this.stage;
            if matches!(stage.as_mut().project(), StageProj::Done) {
                return;
            }
            // Dropped while a panic of the owner unwinds (a local of an async block that
            // panicked): that panic's site is its catch's, kept aside meanwhile.
            with_site_set_aside(|| {
                let previous = start_capturing();
                drop_in_catch(this.name, stage, "dropping the unfinished task panicked: caught");
                if let Some(site) = stop_capturing(previous) {
                    log_site(this.name, &site, "a panic was caught while dropping the task");
                }
            });
        }
    }
}

pin_project! {
    #[project = StageProj]
    enum Stage<F> {
        Running { #[pin] future: F },
        Done,
    }
}

impl<F> CatchPanic<F> {
    /// The name used when a panic is reported.
    #[must_use]
    pub fn name(&self) -> &TaskName {
        &self.name
    }

    /// Does not log the panic: the caller takes over that duty, typically to log it with
    /// context the name cannot carry cheaply (a job's index). A caught panic that is neither
    /// logged here nor by the caller is a silent panic, which this crate exists to prevent.
    /// The panics it never returns (a second one from the panicked future's destructor, one
    /// caught inside the future, one from dropping it unfinished) are still logged here.
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_supervise::catch_panic;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let job = 17;
    /// if let Err(panic) = catch_panic("job", async { panic!("bad input") }).without_logging().await {
    ///     eprintln!("job {job}: {panic}"); // the caller's own report
    /// }
    /// # }
    /// ```
    pub fn without_logging(mut self) -> Self {
        self.log = false;
        self
    }
}

impl<F: Future> Future for CatchPanic<F> {
    type Output = Result<F::Output, PanicError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut stage = this.stage;
        assert!(
            matches!(stage.as_mut().project(), StageProj::Running { .. }),
            "`CatchPanic` polled after completion"
        );
        // Restoring the previous flag (rather than clearing it) keeps nested adapters right:
        // a `CatchPanic` polled inside another one's poll hands the flag back on return.
        let previous = start_capturing();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let polled = match stage.as_mut().project() {
                StageProj::Running { future } => future.poll(cx),
                StageProj::Done => unreachable!("checked above"),
            };
            if polled.is_ready() {
                // Dropped here, inside the catch: its destructor is user code too.
                stage.set(Stage::Done);
            }
            polled
        }));
        let result = match result {
            Ok(polled) => Ok(polled),
            Err(payload) => {
                // Built before the future is dropped: a panic of its destructor would record
                // its own site over this one's.
                let error = panic_error(this.name.clone(), payload.as_ref());
                error.keep_payload(payload);
                // A future that panicked is dropped inside a catch as well; a second panic
                // from its destructor is logged apart (the first one is the task's).
                drop_in_catch(
                    this.name,
                    stage,
                    "dropping the panicked task's future panicked too",
                );
                Err(error)
            }
        };
        // A panic the future (or its destructor) caught itself left its site here, and
        // nobody else reports it.
        if let Some(site) = stop_capturing(previous) {
            log_site(this.name, &site, "a panic was caught inside the task");
        }
        match result {
            Ok(polled) => polled.map(Ok),
            Err(error) => {
                if *this.log {
                    log_panic(&error, "task panicked");
                }
                Poll::Ready(Err(error))
            }
        }
    }
}

impl<F> fmt::Debug for CatchPanic<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CatchPanic")
            .field("name", &self.name)
            .field("done", &matches!(self.stage, Stage::Done))
            .finish_non_exhaustive()
    }
}

/// What the hook saw of the latest panic on this thread while a `CatchPanic` was polling.
struct PanicSite {
    message: Option<String>,
    location: Option<String>,
    backtrace: Backtrace,
}

/// This thread's capture: whether a `CatchPanic` polls (or drops its future) now, and the
/// site the hook recorded of the latest panic meanwhile. One thread-local, so that a poll
/// starts and ends with one access each.
struct Capture {
    capturing: Cell<bool>,
    site: RefCell<Option<PanicSite>>,
}

thread_local! {
    static CAPTURE: Capture = const {
        Capture {
            capturing: Cell::new(false),
            site: RefCell::new(None),
        }
    };
}

/// Marks this thread as capturing; returns the previous mark (restoring it, rather than
/// clearing it, keeps nested adapters right). `try_with` throughout: a `CatchPanic` may be
/// dropped during thread-local destruction.
fn start_capturing() -> bool {
    CAPTURE
        .try_with(|capture| capture.capturing.replace(true))
        .unwrap_or(false)
}

/// Restores the mark and takes the site left over (a panic caught inside), in one access.
fn stop_capturing(previous: bool) -> Option<PanicSite> {
    CAPTURE
        .try_with(|capture| {
            capture.capturing.set(previous);
            capture.site.take()
        })
        .ok()
        .flatten()
}

/// Runs `f` with the recorded site (a panic on its way to the catch that reports it) set
/// aside, and puts it back after.
fn with_site_set_aside<R>(f: impl FnOnce() -> R) -> R {
    let saved = take_any_site();
    let result = f();
    if let Some(site) = saved {
        let _ = CAPTURE.try_with(|capture| *capture.site.borrow_mut() = Some(site));
    }
    result
}

/// Drops `stage`'s future inside a catch; a panic of its destructor is logged as `what`.
fn drop_in_catch<F>(name: &TaskName, mut stage: Pin<&mut Stage<F>>, what: &'static str) {
    run_drop_caught(name, what, || stage.set(Stage::Done));
}

/// Runs `drop_it` inside a catch; a panic of it is logged as `what`, under `name`.
fn run_drop_caught(name: &TaskName, what: &'static str, drop_it: impl FnOnce()) {
    if let Err(payload) = std::panic::catch_unwind(AssertUnwindSafe(drop_it)) {
        let error = panic_error(name.clone(), payload.as_ref());
        drop_payload(payload);
        log_panic(&error, what);
    }
}

static HOOK: Once = Once::new();

/// Set by [`log_panics_to_tracing`]: the panics nobody catches go to `tracing`.
static TO_TRACING: AtomicBool = AtomicBool::new(false);

/// Sends every panic that no [`catch_panic`] catches (in the application's own threads and
/// tasks, `tokio::spawn` included) to `tracing` at error level, with its message, location,
/// thread and backtrace, instead of the default hook's text on stderr: a service then has its
/// panics in its structured logs. Panics inside a [`catch_panic`] (and so on every task
/// taskweave spawns) are logged by it, once, as before.
///
/// It installs taskweave's panic hook (if this is the first use of the crate) around the hook
/// in place now, which it no longer calls while a `tracing` subscriber takes error events
/// (when none does, the panic still goes to the previous hook, so it is never silent). Call it
/// once, early, after installing the subscriber; a hook the application installs after it
/// replaces it. Idempotent. If the application replaced taskweave's hook before this call
/// (after an earlier first use of the crate), the call changes nothing: install your own
/// hook's logging instead.
///
/// # Examples
///
/// ```
/// taskweave_supervise::log_panics_to_tracing();
/// let thread = std::thread::spawn(|| panic!("a panic on a plain thread"));
/// // Reported through `tracing` (at error) when a subscriber takes error events.
/// assert!(thread.join().is_err());
/// ```
pub fn log_panics_to_tracing() {
    TO_TRACING.store(true, Ordering::Relaxed);
    install_hook();
}

fn install_hook() {
    // `take_hook`/`set_hook` panic on a thread that is already panicking (a first
    // `catch_panic` inside a `Drop` during unwinding); install on the next call instead.
    if HOOK.is_completed() || std::thread::panicking() {
        return;
    }
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
            // `try_with`: a panic during thread-local destruction must still reach a hook.
            let capturing = CAPTURE
                .try_with(|capture| capture.capturing.get())
                .unwrap_or(false);
            if !capturing {
                if TO_TRACING.load(Ordering::Relaxed) && tracing::enabled!(tracing::Level::ERROR) {
                    log_uncaught(info);
                } else {
                    previous(info);
                }
                return;
            }
            let site = PanicSite {
                // `PanicHookInfo::payload_as_str` (1.91) is newer than our floor.
                message: payload_str(info.payload()).map(ToOwned::to_owned),
                location: info.location().map(ToString::to_string),
                backtrace: Backtrace::force_capture(),
            };
            // A panic raised while another unwinds (in a destructor run by that unwind, which
            // catches it, or the process aborts) must not replace the site of the one
            // unwinding, which its catch reports: it is logged here instead.
            let nested = std::thread::panicking()
                && CAPTURE
                    .try_with(|capture| capture.site.borrow().is_some())
                    .unwrap_or(false);
            if nested {
                if tracing::enabled!(tracing::Level::ERROR) {
                    log_site(
                        &TaskName::from("<destructor>"),
                        &site,
                        "a panic while another unwound, in a destructor",
                    );
                } else {
                    previous(info);
                }
                return;
            }
            let recorded = CAPTURE
                .try_with(|capture| *capture.site.borrow_mut() = Some(site))
                .is_ok();
            // Nobody would hear of this panic through `tracing`: keep the default report too.
            if !recorded || cfg!(panic = "abort") || !tracing::enabled!(tracing::Level::ERROR) {
                previous(info);
            }
        }));
    });
}

/// A caught panic, as one `tracing` event at error.
fn log_panic(error: &PanicError, what: &'static str) {
    tracing::error!(
        task = %error.name(),
        panic = %error.message(),
        location = error.location().unwrap_or("unknown"),
        backtrace = %error.backtrace(),
        "{what}"
    );
}

/// A panic known only by the site the hook recorded, as one `tracing` event at error.
fn log_site(name: &TaskName, site: &PanicSite, what: &'static str) {
    tracing::error!(
        task = %name,
        panic = site.message.as_deref().unwrap_or("Box<dyn Any>"),
        location = site.location.as_deref().unwrap_or("unknown"),
        backtrace = %site.backtrace,
        "{what}"
    );
}

/// Takes whatever site the hook recorded on this thread.
fn take_any_site() -> Option<PanicSite> {
    CAPTURE
        .try_with(|capture| capture.site.take())
        .ok()
        .flatten()
}

/// A panic no `catch_panic` catches, as one `tracing` event.
fn log_uncaught(info: &PanicHookInfo<'_>) {
    let thread = std::thread::current();
    tracing::error!(
        panic = payload_str(info.payload()).unwrap_or("Box<dyn Any>"),
        location = info.location().map(ToString::to_string).as_deref().unwrap_or("unknown"),
        thread = thread.name().unwrap_or("<unnamed>"),
        backtrace = %Backtrace::force_capture(),
        "panicked"
    );
}

fn panic_error(name: TaskName, payload: &(dyn std::any::Any + Send)) -> PanicError {
    let message = payload_message(payload);
    let (location, backtrace) = match take_site(&message) {
        Some(site) => (site.location, site.backtrace),
        None => (None, Backtrace::disabled()),
    };
    PanicError::new(name, message, location, backtrace)
}

/// Takes the site the hook recorded on this thread. It belongs to the panic with `message`
/// unless user code caught a panic of its own in between and this one skipped the hook
/// (`resume_unwind`): the message tells them apart.
fn take_site(message: &str) -> Option<PanicSite> {
    // `try_with`: reached from `drop_caught`, which may run during thread-local teardown.
    take_any_site().filter(|site| {
        site.message
            .as_deref()
            .is_none_or(|recorded| recorded == message)
    })
}

/// The payload's text, when it is a `&str` or a `String` (what `panic!` produces).
fn payload_str(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    payload
        .downcast_ref::<&'static str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
}

fn payload_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&'static str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "Box<dyn Any>".to_owned()
    }
}

/// Drops a panic payload (user data) without letting a panic of its own `Drop` unwind into
/// the code that caught the first panic: that second payload is forgotten, a leak of one
/// box, never a lost task.
pub(crate) fn drop_payload(payload: Box<dyn std::any::Any + Send>) {
    if let Err(nested) = std::panic::catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(nested);
    }
}

/// Drops a user value on one of our tasks: a panic of its `Drop` is caught (its payload
/// dropped the same careful way) and logged, instead of taking the task down. A site already
/// recorded (a panic caught and about to be resumed, or one the task caught itself) is set
/// aside meanwhile, so that the value's panic never replaces it.
pub(crate) fn drop_caught<T>(name: &TaskName, value: T) {
    with_site_set_aside(|| {
        run_drop_caught(name, "a value's Drop panicked: caught", move || drop(value));
    });
}

/// Formats a user value with its `Display` on one of our tasks: a panic there is caught and
/// a placeholder comes back instead.
pub(crate) fn display_caught(value: &dyn fmt::Display) -> String {
    match std::panic::catch_unwind(AssertUnwindSafe(|| value.to_string())) {
        Ok(text) => text,
        Err(payload) => {
            // Its site is taken so that no later report mistakes it for another panic.
            let _site = take_site(&payload_message(payload.as_ref()));
            drop_payload(payload);
            "<the error's Display panicked>".to_owned()
        }
    }
}

/// Builds a `PanicError` for a panic that tokio caught instead of us (a panicking `Drop` of
/// the task's future, for example), where neither location nor backtrace is known.
pub(crate) fn panic_error_from_payload(
    name: TaskName,
    payload: &(dyn std::any::Any + Send),
) -> PanicError {
    let message = payload_message(payload);
    // Taken so that it cannot be matched to a later panic; not reported, as before.
    let _site = take_site(&message);
    PanicError::new(name, message, None, Backtrace::disabled())
}
