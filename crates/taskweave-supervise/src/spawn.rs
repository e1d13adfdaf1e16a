//! `spawn`: a named tokio task whose panic is captured, logged and handed to the awaiter.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::task::{AbortHandle, JoinError, JoinHandle};

use crate::catch::{drop_payload, panic_error_from_payload};
use crate::{PanicError, TaskError, TaskName, catch_panic};

/// Spawns `future` on the current tokio runtime as a task named `name`, capturing its panic.
///
/// A panic is caught on the task itself, logged through `tracing` at error level with the name,
/// message, location and backtrace, and handed to whoever awaits the returned [`TaskHandle`]
/// as [`TaskError::Panicked`]. A detached task (its handle dropped) is therefore never silent:
/// with plain `tokio::spawn` a panic only reaches a caller that awaits the `JoinHandle`, and
/// without a backtrace. The panic never reaches the runtime, so the process and every other
/// task keep running.
///
/// The task is not tracked by anyone: use a [`Supervisor`](crate::Supervisor) when shutdown
/// must wait for it.
///
/// # Examples
///
/// ```
/// use taskweave_supervise::spawn;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let worker = spawn("worker", async { panic!("boom") });
/// let error = worker.await.unwrap_err();
/// assert!(error.is_panic());
/// assert_eq!(error.to_string().split(" at ").next(), Some("task `worker` panicked"));
///
/// let answer = spawn("answer", async { 42 });
/// assert_eq!(answer.await.unwrap(), 42);
/// # }
/// ```
///
/// # Panics
///
/// Panics when called outside a tokio runtime, like `tokio::spawn`.
#[track_caller]
pub fn spawn<F>(name: impl Into<TaskName>, future: F) -> TaskHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let name = name.into();
    let join = tokio::spawn(catch_panic(name.clone(), future));
    TaskHandle::new(name, join)
}

/// An owned permission to await (and abort) a task started by [`spawn`] or a
/// [`Supervisor`](crate::Supervisor).
///
/// Awaiting it yields the task's output, or a [`TaskError`] when it panicked or was aborted.
/// Dropping it detaches the task, which keeps running; a later panic is still logged.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskweave_supervise::{TaskError, spawn};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let task = spawn("sleeper", tokio::time::sleep(Duration::from_secs(60)));
/// assert_eq!(task.name(), "sleeper");
/// assert!(!task.is_finished());
/// task.abort();
/// let error = task.await.unwrap_err();
/// assert!(matches!(error, TaskError::Aborted { .. }));
/// assert_eq!(error.to_string(), "task `sleeper` was aborted");
/// # }
/// ```
///
/// # Cancel safety
///
/// Awaiting a `TaskHandle` is cancel safe: dropping the `.await` loses nothing, and the handle
/// can be awaited again.
pub struct TaskHandle<T> {
    name: TaskName,
    join: JoinHandle<Result<T, PanicError>>,
}

impl<T> TaskHandle<T> {
    pub(crate) fn new(name: TaskName, join: JoinHandle<Result<T, PanicError>>) -> Self {
        TaskHandle { name, join }
    }

    /// The task's name.
    #[must_use]
    pub fn name(&self) -> &TaskName {
        &self.name
    }

    /// Aborts the task; awaiting the handle then yields [`TaskError::Aborted`] unless the task
    /// had already finished.
    pub fn abort(&self) {
        self.join.abort();
    }

    /// A handle that can abort the task without owning the result.
    #[must_use]
    pub fn abort_handle(&self) -> AbortHandle {
        self.join.abort_handle()
    }

    /// `true` once the task has finished (completed, panicked or aborted).
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.join.is_finished()
    }

    /// The tokio task id.
    #[must_use]
    pub fn id(&self) -> tokio::task::Id {
        self.join.id()
    }

    fn map_join_error(&self, error: JoinError) -> TaskError {
        if error.is_panic() {
            // Only a panic outside our catches gets here (a panicking `tracing` subscriber
            // while a caught panic is logged): the future's own `Drop` is caught by
            // `CatchPanic`, also when the task is aborted.
            let payload = error.into_panic();
            let panic = panic_error_from_payload(self.name.clone(), payload.as_ref());
            drop_payload(payload);
            TaskError::Panicked(panic)
        } else {
            TaskError::Aborted {
                name: self.name.clone(),
            }
        }
    }
}

impl<T> Future for TaskHandle<T> {
    type Output = Result<T, TaskError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let joined = ready!(Pin::new(&mut self.join).poll(cx));
        Poll::Ready(match joined {
            Ok(Ok(output)) => Ok(output),
            Ok(Err(panic)) => Err(TaskError::Panicked(panic)),
            Err(error) => Err(self.map_join_error(error)),
        })
    }
}

impl<T> fmt::Debug for TaskHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskHandle")
            .field("name", &self.name)
            .field("id", &self.join.id())
            .field("finished", &self.join.is_finished())
            .finish()
    }
}
