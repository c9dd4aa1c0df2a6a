//! Trying again, written once: [`Backoff::retry_until`] for a request that must reach the
//! store (a clean-up, a setting a busy store refuses for a moment), [`Restarts`] and
//! [`supervise`] for a task that must keep running (a store listener).
//!
//! tower's `retry::{Policy, Backoff}` is the model: the caller says which failures are
//! worth another try, the backoff says when.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::values::options::Backoff;

impl Backoff {
    /// Runs `op` until it succeeds, fails in a way `is_retryable` refuses, or `deadline`
    /// (if any) has passed, pausing between tries as this backoff says (a pause never
    /// reaches past the deadline). Returns the last outcome and how many tries it took.
    ///
    /// For requests that are safe to repeat and must land: a release, leaving a queue,
    /// deleting a node, a setting refused while the store is busy.
    pub async fn retry_until<T, E, F, Fut>(
        &self,
        deadline: Option<Instant>,
        mut is_retryable: impl FnMut(&E) -> bool,
        mut op: F,
    ) -> (Result<T, E>, u32)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut tries = 0;
        loop {
            let outcome = op().await;
            tries += 1;
            let Err(err) = &outcome else {
                return (outcome, tries);
            };
            let left = deadline.map(|at| at.saturating_duration_since(crate::values::clock::now()));
            if left.is_some_and(|left| left.is_zero()) || !is_retryable(err) {
                return (outcome, tries);
            }
            let pause = self.pause(tries - 1);
            tokio::time::sleep(left.map_or(pause, |left| pause.min(left))).await;
        }
    }
}

/// The store did not answer (unreachable, or too slow), so a request may or may not have
/// landed: what [`Backoff::retry_until`] retries for clean-ups that are safe to repeat.
pub fn unanswered(err: &crate::Error) -> bool {
    matches!(
        err.kind(),
        crate::ErrorKind::Unavailable | crate::ErrorKind::TimedOut
    )
}

/// The pauses between runs of a task that must keep running: doubling from the backoff's
/// `initial` to its `max` while runs fail, and back to `initial` once a run got somewhere
/// ([`progressed`](Self::progressed)). Each pause is jittered into its upper half, so
/// clients that lost one server together do not come back together, and none retries at
/// once.
#[derive(Clone, Debug)]
pub struct Restarts {
    backoff: Backoff,
    next: Duration,
}

impl Restarts {
    /// Pauses following `backoff`.
    pub fn new(backoff: Backoff) -> Self {
        Restarts {
            backoff,
            next: backoff.initial,
        }
    }

    /// The last run got somewhere (it subscribed, it opened its stream): the next failure
    /// is a new one, retried soon.
    pub fn progressed(&mut self) {
        self.next = self.backoff.initial;
    }

    /// The pause before the next run; the one after it doubles.
    pub fn next_pause(&mut self) -> Duration {
        let cap = self.next;
        self.next = self.next.saturating_mul(2).min(self.backoff.max);
        cap.mul_f64(0.5 + fastrand::f64() / 2.0)
    }
}

/// Handed to each run of a [`supervise`]d task (it may move into the run's future), to say
/// it got somewhere.
#[derive(Clone, Debug, Default)]
pub struct Progress(Arc<AtomicBool>);

impl Progress {
    /// The run got somewhere: the pause after it ends starts from the backoff's `initial`.
    pub fn made(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn was_made(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Runs `run` again and again until the returned future is dropped, pausing between runs
/// as [`Restarts`] with `backoff` says. A run that ends, with an error or without, is
/// logged under `what` and restarted.
pub async fn supervise<F, Fut, E>(what: &'static str, backoff: Backoff, mut run: F)
where
    F: FnMut(Progress) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut restarts = Restarts::new(backoff);
    loop {
        let progress = Progress::default();
        let outcome = run(progress.clone()).await;
        if progress.was_made() {
            restarts.progressed();
        }
        match outcome {
            Ok(()) => tracing::debug!(task = what, "ended; restarting"),
            Err(err) => tracing::debug!(task = what, error = %err, "failed; restarting"),
        }
        tokio::time::sleep(restarts.next_pause()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::error::{Error, ErrorKind};

    const QUICK: Backoff = Backoff {
        initial: Duration::from_millis(1),
        max: Duration::from_millis(4),
    };

    #[tokio::test]
    async fn retry_until_retries_what_it_is_told_to_until_it_succeeds() {
        let mut failures = 3;
        let (outcome, tries) = QUICK
            .retry_until(None, Error::is_retryable, || {
                let failed = failures > 0;
                failures -= 1;
                async move {
                    if failed {
                        Err(Error::unavailable("down"))
                    } else {
                        Ok(7)
                    }
                }
            })
            .await;
        assert_eq!(outcome.expect("succeeds in the end"), 7);
        assert_eq!(tries, 4);
    }

    #[tokio::test]
    async fn retry_until_returns_a_refused_failure_at_once() {
        let (outcome, tries) = QUICK
            .retry_until(None, Error::is_retryable, || async {
                Err::<(), _>(Error::new(ErrorKind::PermissionDenied, "no"))
            })
            .await;
        assert_eq!(
            outcome.expect_err("refused").kind(),
            ErrorKind::PermissionDenied
        );
        assert_eq!(tries, 1);
    }

    #[tokio::test]
    async fn retry_until_stops_at_its_deadline() {
        let deadline = crate::values::clock::now() + Duration::from_millis(30);
        let (outcome, tries) = QUICK
            .retry_until(
                Some(deadline),
                |_: &&str| true,
                || async { Err::<(), _>("down") },
            )
            .await;
        assert_eq!(outcome, Err("down"));
        assert!(tries > 1, "tried again before the deadline");
        // The last try starts no later than the deadline: no pause reaches past it.
        assert!(crate::values::clock::now() < deadline + Duration::from_secs(1));
        let (_, tries) = QUICK
            .retry_until(
                Some(crate::values::clock::now()),
                |_: &&str| true,
                || async { Err::<(), _>("down") },
            )
            .await;
        assert_eq!(tries, 1, "a deadline already passed allows one try");
    }

    #[test]
    fn restarts_double_to_the_cap_and_start_again_after_progress() {
        let mut restarts = Restarts::new(Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(400),
        });
        let caps = [100, 200, 400, 400].map(Duration::from_millis);
        for cap in caps {
            let pause = restarts.next_pause();
            assert!(
                cap / 2 <= pause && pause <= cap,
                "{pause:?} not in [{:?}, {cap:?}]",
                cap / 2
            );
        }
        restarts.progressed();
        assert!(restarts.next_pause() <= Duration::from_millis(100));
    }

    #[tokio::test]
    async fn supervise_restarts_a_failed_run() {
        let mut runs = 0;
        let supervised = supervise("test", QUICK, |progress| {
            runs += 1;
            let run = runs;
            async move {
                if run >= 3 {
                    progress.made();
                    std::future::pending::<()>().await;
                }
                Err::<(), _>("failed")
            }
        });
        let _ = tokio::time::timeout(Duration::from_millis(200), supervised).await;
        assert_eq!(runs, 3, "restarted after each failure, and only then");
    }
}
