//! Waiting for a held key: attempts with backoff, woken early by store notifications.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::time::{sleep_until, Instant as TokioInstant};

use crate::backend::{Change, KeyWatch};
use crate::defects::{self, CoreDefect};
use crate::values::error::{Error, ErrorKind, Result};
use crate::values::key::LockKey;
use crate::values::options::{saturating_add, WaitSpec};

/// Who a store's notification wakes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wakes {
    /// Possibly several waiters for one release: after a wake-up in vain, pause first.
    Herd,
    /// Only the waiter whose turn it may be (a fair queue's head): attempt at once.
    Turn,
}

/// A subscription being set up.
pub(crate) type Subscribing<'a> =
    Pin<Box<dyn Future<Output = Result<Option<Box<dyn KeyWatch>>>> + Send + 'a>>;

/// Attempts until one grants the key or the wait ends: while the key is held, pauses with
/// exponential backoff and full jitter.
///
/// `attempt` is called with the time-out of one request and answers
/// [`ErrorKind::HeldByAnother`] while the key is not ours. With a subscription the pause
/// also ends when the store reports a change; it is started *before* the first attempt,
/// so a release between an attempt and the pause cannot be missed, and the backoff still
/// caps every pause, so a dropped notification costs at most one poll interval. An
/// unreachable store is retried within the wait; if the wait ends while the store is
/// unreachable the error is [`ErrorKind::Unavailable`], not a time-out, because the key
/// may well be free.
///
/// The subscription is set up alongside the attempts: a slow one makes the waiter poll
/// meanwhile, so it cannot use up a bounded wait. When it completes after an attempt
/// began, the waiter attempts again at once, so a release between that attempt and the
/// subscription is not missed.
/// The first attempt after a notification goes at once (the fast hand-over); if it fails
/// too, later wake-ups pause with jittered backoff first, so clients woken together by one
/// release do not retry in lock-step (quorum stores need that to break split votes). The
/// fallback poll is jittered for the same reason.
pub(crate) async fn wait_for_grant<'a, T, A, F>(
    key: &LockKey,
    wait: &WaitSpec,
    start: WaitStart,
    subscribing: Option<Subscribing<'a>>,
    mut attempt_once: A,
) -> Result<T>
where
    A: FnMut(Duration) -> F,
    F: Future<Output = Result<T>>,
{
    let mut waiter = Waiter {
        wait,
        wakes: start.wakes,
        store_answered: start.store_answered,
        subscribing,
        watch: None,
        woken_in_vain: 0,
        attempts: 0,
    };
    let mut last_failure: Option<Error> = None;
    loop {
        // A pause that ran to the end of the wait ends it: another attempt now would get a
        // whole request time-out past the bound.
        if let Some(failure) = last_failure.take() {
            if wait
                .until
                .is_some_and(|until| crate::values::clock::now() >= until)
            {
                return Err(timed_out(key, failure));
            }
        }
        let (failure, subscribed_meanwhile) = match waiter.attempt(&mut attempt_once).await {
            Attempted::Granted(lease) => return Ok(lease),
            Attempted::GaveUp(err) => return Err(err),
            Attempted::NotYet {
                failure,
                subscribed_meanwhile,
            } => (failure, subscribed_meanwhile),
        };
        let now = crate::values::clock::now();
        if wait.until.is_some_and(|until| now >= until) {
            return Err(timed_out(key, failure));
        }
        if subscribed_meanwhile && failure.kind() == ErrorKind::HeldByAnother {
            continue;
        }
        waiter.pause(failure.kind(), now).await;
        last_failure = Some(failure);
    }
}

/// How a wait that ran out after `failure` ends: timed out while the key was held, or
/// with the failure itself (an unreachable store, say: the key may well be free).
fn timed_out(key: &LockKey, failure: Error) -> Error {
    match failure.kind() {
        ErrorKind::HeldByAnother => Error::new(
            ErrorKind::TimedOut,
            format!("{:?} stayed held for the whole wait", key.as_str()),
        ),
        _ => failure,
    }
}

/// How a wait begins.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WaitStart {
    /// Who a notification wakes.
    pub wakes: Wakes,
    /// Whether the store has answered this acquisition already (a fair queue's enqueue
    /// is an answer).
    pub store_answered: bool,
}

/// What one attempt of a wait came to: a lease (or a set's leases) when granted.
enum Attempted<T> {
    Granted(T),
    /// An error that ends the wait.
    GaveUp(Error),
    /// The key is still held (or the store did not answer): pause, then attempt again.
    NotYet {
        failure: Error,
        /// The subscription completed while the attempt ran: a release before it may have
        /// gone unheard.
        subscribed_meanwhile: bool,
    },
}

/// The state of one wait between its attempts.
struct Waiter<'w, 'a> {
    wait: &'w WaitSpec,
    wakes: Wakes,
    /// Whether the store has answered this acquisition yet: an attempt cut short by the
    /// end of the wait then means the wait is over.
    store_answered: bool,
    subscribing: Option<Subscribing<'a>>,
    watch: Option<Box<dyn KeyWatch>>,
    /// Notification wake-ups so far whose attempt still found the key held.
    woken_in_vain: u32,
    attempts: u32,
}

impl Waiter<'_, '_> {
    /// One attempt, bounded by the wait too, so a silent store cannot hold a bounded
    /// waiter past its bound.
    async fn attempt<T, A, F>(&mut self, attempt_once: &mut A) -> Attempted<T>
    where
        A: FnMut(Duration) -> F,
        F: Future<Output = Result<T>>,
    {
        let (wait, now) = (self.wait, crate::values::clock::now());
        // A wait whose bound went by before this attempt (spent entering a fair queue)
        // gets an attempt cut at once: one answered without a wait, or none.
        let (timeout, cut_by_wait) = match wait.until {
            Some(until) if until.saturating_duration_since(now) < wait.request_timeout => {
                (until.saturating_duration_since(now), true)
            }
            _ => (wait.request_timeout, false),
        };
        let once = attempt_once(timeout);
        let (outcome, subscribed_meanwhile) =
            alongside(once, &mut self.subscribing, &mut self.watch).await;
        self.attempts = self.attempts.saturating_add(1);
        tracing::Span::current().record("attempts", self.attempts);
        let failure = match outcome {
            Ok(lease) => return Attempted::Granted(lease),
            Err(err) if err.kind() == ErrorKind::HeldByAnother => {
                self.store_answered = true;
                err
            }
            // An attempt cut short by the end of the wait, on a store that has been
            // answering, means the wait is over, not that the store is gone.
            Err(err)
                if err.kind() == ErrorKind::Unavailable && cut_by_wait && self.store_answered =>
            {
                Error::new(ErrorKind::HeldByAnother, err.message().to_string())
            }
            Err(err) if err.kind() == ErrorKind::Unavailable => err,
            Err(err) => return Attempted::GaveUp(err),
        };
        Attempted::NotYet {
            failure,
            subscribed_meanwhile,
        }
    }

    /// The pause after a failed attempt (of kind `failed`) that ended at `now`: until a
    /// notification or the fallback poll where the key is watched, the backoff otherwise.
    async fn pause(&mut self, failed: ErrorKind, now: Instant) {
        let wait = self.wait;
        let wake = self.bounded(saturating_add(now, wait.backoff.pause(self.attempts - 1)));
        match self.watch.as_mut() {
            Some(changes) if failed == ErrorKind::HeldByAnother => {
                // Half to all of the cap, so waiters that lost notifications together do
                // not poll together.
                let max = wait.backoff.max;
                let jittered = max / 2 + (max / 2).mul_f64(fastrand::f64());
                let fallback = within(wait, saturating_add(now, jittered));
                let changed = tokio::select! {
                    changed = changes.changed() => changed,
                    () = sleep_until(TokioInstant::from_std(fallback)) => return,
                };
                self.woken(changed).await;
            }
            // Polling; a subscription completing meanwhile ends the pause, and the attempt
            // that follows at once covers a release before it.
            _ => match self.subscribing.as_mut() {
                Some(pending) => tokio::select! {
                    subscribed = pending => {
                        self.subscribing = None;
                        self.watch = subscription_made(subscribed);
                    }
                    () = sleep_until(TokioInstant::from_std(wake)) => {}
                },
                None => sleep_until(TokioInstant::from_std(wake)).await,
            },
        }
    }

    /// A notification arrived: after wake-ups in vain, a herd pauses before attempting.
    async fn woken(&mut self, changed: Result<Change>) {
        match changed {
            Err(err) => {
                tracing::debug!(error = %err, "notification stream ended; polling instead");
                self.watch = None;
            }
            // Not a release someone else won: attempt at once, and a failure after it says
            // nothing about contention.
            Ok(Change::LookAgain) => {}
            Ok(Change::Released) => {
                if self.woken_in_vain > 0 && self.wakes == Wakes::Herd {
                    let pause = self.wait.backoff.pause(self.woken_in_vain - 1);
                    let resume = self.bounded(saturating_add(crate::values::clock::now(), pause));
                    sleep_until(TokioInstant::from_std(resume)).await;
                }
                self.woken_in_vain = self.woken_in_vain.saturating_add(1);
            }
        }
    }

    /// `instant`, or the end of the wait if sooner.
    fn bounded(&self, instant: Instant) -> Instant {
        within(self.wait, instant)
    }
}

/// `instant`, or the end of `wait` if sooner.
fn within(wait: &WaitSpec, instant: Instant) -> Instant {
    if defects::active(CoreDefect::PauseBeyondWait) {
        return instant;
    }
    wait.until.map_or(instant, |until| instant.min(until))
}

/// Runs `work` while driving a pending subscription, keeping the watch once it is made.
/// Also says whether the subscription completed only after `work` had begun.
async fn alongside<T>(
    work: impl Future<Output = T>,
    subscribing: &mut Option<Subscribing<'_>>,
    watch: &mut Option<Box<dyn KeyWatch>>,
) -> (T, bool) {
    // A subscription ready at once (an in-process store) is in place before the attempt.
    if let Some(pending) = subscribing.as_mut() {
        if let Poll::Ready(subscribed) = poll_fn(|cx| Poll::Ready(pending.as_mut().poll(cx))).await
        {
            *subscribing = None;
            *watch = subscription_made(subscribed);
        }
    }
    let mut work = pin!(work);
    let mut subscribed_meanwhile = false;
    loop {
        let Some(pending) = subscribing.as_mut() else {
            return (work.await, subscribed_meanwhile);
        };
        tokio::select! {
            subscribed = pending => {
                *subscribing = None;
                *watch = subscription_made(subscribed);
                subscribed_meanwhile = true;
            }
            output = &mut work => return (output, subscribed_meanwhile),
        }
    }
}

fn subscription_made(subscribed: Result<Option<Box<dyn KeyWatch>>>) -> Option<Box<dyn KeyWatch>> {
    subscribed.unwrap_or_else(|err| {
        tracing::debug!(error = %err, "subscription failed; polling instead");
        None
    })
}
