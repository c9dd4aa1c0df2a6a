//! The runtime a blocking client's I/O runs on, and the caller's thread its patterns'
//! work runs on.

use std::future::Future;
use std::sync::mpsc;

use lock_core::LockScope;
use tokio::sync::oneshot;
use tokio::task::JoinError;

use crate::{Error, ErrorKind, Result};

/// What the runtime asks of the thread that waits for it.
pub(super) enum Step<O, R> {
    /// Run the caller's work under this scope, and reply.
    Work(LockScope, oneshot::Sender<R>),
    /// The runtime's part is over, with this outcome.
    Done(std::result::Result<Result<O>, JoinError>),
}

/// How a task on the runtime has the waiting thread run the caller's synchronous work
/// (which need not be `Send`: it never leaves that thread) and waits for its reply `R`.
pub(super) struct CallerThread<O, R> {
    pub(super) steps: mpsc::Sender<Step<O, R>>,
}

impl<O, R> CallerThread<O, R> {
    /// Hands `scope` to the waiting thread and resolves with the work's reply; `None` if
    /// that thread stopped waiting (the work panicked there).
    pub(super) async fn run(&self, scope: LockScope) -> Option<R> {
        let (reply, replied) = oneshot::channel();
        self.steps.send(Step::Work(scope, reply)).ok()?;
        replied.await.ok()
    }
}

/// A task's outcome; its panic resumed on the waiting thread.
pub(super) fn finished<T>(joined: std::result::Result<Result<T>, JoinError>) -> Result<T> {
    match joined {
        Ok(result) => result,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        // Tasks are cancelled only by the runtime's shutdown, which waits for the last
        // handle, and the waiting client or guard is one.
        Err(_) => Err(stopped()),
    }
}

/// The error of a blocking call whose runtime stopped before it answered.
pub(super) fn stopped() -> Error {
    Error::new(
        ErrorKind::Internal,
        "the blocking client's runtime stopped during a request",
    )
}

/// The runtime a blocking client and its guards run on.
#[derive(Debug)]
pub(super) struct Runtime {
    pub(super) handle: tokio::runtime::Handle,
    /// Taken by the drop, to shut the runtime down in the way the dropping thread allows.
    pub(super) owned: Option<tokio::runtime::Runtime>,
}

impl Runtime {
    pub(super) fn start() -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("distlock-blocking")
            .enable_all()
            .build()
            .map_err(|err| {
                Error::new(
                    ErrorKind::Internal,
                    "could not start the blocking client's runtime thread",
                )
                .with_source(err)
            })?;
        Ok(Runtime {
            handle: runtime.handle().clone(),
            owned: Some(runtime),
        })
    }

    /// Runs `future` on the runtime and blocks this thread until it is done. The future
    /// runs as a task, never on this thread, so this works whatever the thread is doing
    /// (`Handle::block_on` panics inside another runtime); a panic in it is resumed here.
    pub(super) fn wait<T: Send + 'static>(
        &self,
        future: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let task = self.handle.spawn(future);
        let (done, outcome) = mpsc::sync_channel(1);
        self.handle.spawn(async move {
            // The receiver waits for this; it is gone only if that thread panicked.
            let _ = done.send(task.await);
        });
        outcome.recv().map_or_else(|_| Err(stopped()), finished)
    }

    /// [`wait`](Self::wait) for a future that borrows from the caller, so cannot be a
    /// task: it runs on a helper thread of this call's own, outside any runtime (where
    /// `Handle::block_on` works), which the borrow outlives.
    pub(super) fn wait_borrowing<T: Send>(
        &self,
        future: impl Future<Output = Result<T>> + Send,
    ) -> Result<T> {
        let handle = &self.handle;
        std::thread::scope(
            |scope| match scope.spawn(move || handle.block_on(future)).join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            },
        )
    }

    /// [`wait`](Self::wait) for a task that has this thread run synchronous work: `task`
    /// gets a [`CallerThread`] to hand `work` its scope; `work` runs here, its reply `R`
    /// goes back to the task, and its local part `L` (which never leaves this thread) is
    /// returned beside the task's outcome, `None` if the task never asked for the work.
    pub(super) fn serve<O, R, L, F>(
        &self,
        task: impl FnOnce(CallerThread<O, R>) -> F,
        work: impl FnOnce(LockScope) -> (R, L),
    ) -> (Result<O>, Option<L>)
    where
        F: Future<Output = Result<O>> + Send + 'static,
        O: Send + 'static,
        R: Send + 'static,
    {
        let (steps, next) = mpsc::channel();
        let task = self.handle.spawn(task(CallerThread {
            steps: steps.clone(),
        }));
        self.handle.spawn(async move {
            // The receiver is gone only if the work panicked on the waiting thread.
            let _ = steps.send(Step::Done(task.await));
        });
        let mut work = Some(work);
        let mut kept = None;
        loop {
            match next.recv() {
                Ok(Step::Work(scope, reply)) => {
                    if let Some(work) = work.take() {
                        let (answer, local) = work(scope);
                        kept = Some(local);
                        // Gone when the task stopped waiting: the lock was lost meanwhile,
                        // which its outcome says.
                        let _ = reply.send(answer);
                    }
                }
                Ok(Step::Done(joined)) => return (finished(joined), kept),
                Err(_) => return (Err(stopped()), kept),
            }
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(runtime) = self.owned.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                // Dropped on an async runtime's thread (a guard dropped by an async
                // task, say), where waiting for the threads to stop would panic.
                runtime.shutdown_background();
            }
            // Elsewhere the drop waits for the runtime's thread to stop.
        }
    }
}
