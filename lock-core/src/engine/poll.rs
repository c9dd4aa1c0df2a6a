//! Waiting for a held key: attempts with backoff, woken early by store notifications.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::time::{sleep_until, Instant as TokioInstant};

use crate::backend::{Change, KeyWatch};
use crate::error::{Error, ErrorKind, Result};
use crate::key::LockKey;
use crate::lease::Lease;
use crate::options::{saturating_add, WaitSpec};

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
pub(crate) async fn wait_for_grant<'a, A, F>(
    key: &LockKey,
    wait: &WaitSpec,
    (wakes, answered): (Wakes, bool),
    subscribing: Option<Subscribing<'a>>,
    mut attempt_once: A,
) -> Result<Lease>
where
    A: FnMut(Duration) -> F,
    F: Future<Output = Result<Lease>>,
{
    let mut subscribing = subscribing;
    let mut watch = None;
    // Notification wake-ups so far whose attempt still found the key held.
    let mut woken_in_vain: u32 = 0;
    let mut attempt: u32 = 0;
    // Whether the store has answered this acquisition yet (a fair queue's enqueue is an
    // answer): an attempt cut short by the end of the wait then means the wait is over.
    let mut store_answered = answered;
    loop {
        let now = Instant::now();
        // Each attempt is bounded by the wait too, so a silent store cannot hold a
        // bounded waiter past its bound.
        let (timeout, cut_by_wait) = match wait.until {
            Some(until) if until > now && until - now < wait.request_timeout => (until - now, true),
            _ => (wait.request_timeout, false),
        };
        let once = attempt_once(timeout);
        let (outcome, subscribed_meanwhile) = alongside(once, &mut subscribing, &mut watch).await;
        let failure = match outcome {
            Ok(lease) => {
                tracing::Span::current().record("attempts", attempt + 1);
                return Ok(lease);
            }
            Err(err) if err.kind() == ErrorKind::HeldByAnother => {
                store_answered = true;
                err
            }
            // An attempt cut short by the end of the wait, on a store that has been
            // answering, means the wait is over, not that the store is gone.
            Err(err) if err.kind() == ErrorKind::Unavailable && cut_by_wait && store_answered => {
                Error::new(ErrorKind::HeldByAnother, err.message().to_string())
            }
            Err(err) if err.kind() == ErrorKind::Unavailable => err,
            Err(err) => return Err(err),
        };
        attempt = attempt.saturating_add(1);
        tracing::Span::current().record("attempts", attempt);
        let now = Instant::now();
        if let Some(until) = wait.until {
            if now >= until {
                return Err(match failure.kind() {
                    ErrorKind::HeldByAnother => Error::new(
                        ErrorKind::TimedOut,
                        format!("{:?} stayed held for the whole wait", key.as_str()),
                    ),
                    _ => failure,
                });
            }
        }
        if subscribed_meanwhile && failure.kind() == ErrorKind::HeldByAnother {
            continue;
        }
        let bounded = |instant: Instant| wait.until.map_or(instant, |until| instant.min(until));
        let wake = bounded(saturating_add(now, wait.backoff.pause(attempt - 1)));
        match watch.as_mut() {
            Some(changes) if failure.kind() == ErrorKind::HeldByAnother => {
                // Half to all of the cap, so waiters that lost notifications together do
                // not poll together.
                let max = wait.backoff.max;
                let jittered = max / 2 + (max / 2).mul_f64(fastrand::f64());
                let fallback = bounded(saturating_add(now, jittered));
                tokio::select! {
                    changed = changes.changed() => match changed {
                        Err(err) => {
                            tracing::debug!(error = %err, "notification stream ended; polling instead");
                            watch = None;
                        }
                        // Not a release someone else won: attempt at once, and a failure
                        // after it says nothing about contention.
                        Ok(Change::LookAgain) => {}
                        Ok(Change::Released) => {
                            if woken_in_vain > 0 && wakes == Wakes::Herd {
                                let pause = wait.backoff.pause(woken_in_vain - 1);
                                let resume = bounded(saturating_add(Instant::now(), pause));
                                sleep_until(TokioInstant::from_std(resume)).await;
                            }
                            woken_in_vain = woken_in_vain.saturating_add(1);
                        }
                    },
                    () = sleep_until(TokioInstant::from_std(fallback)) => {}
                }
            }
            // Polling; a subscription completing meanwhile ends the pause, and the attempt
            // that follows at once covers a release before it.
            _ => match subscribing.as_mut() {
                Some(pending) => tokio::select! {
                    subscribed = pending => {
                        subscribing = None;
                        watch = subscription_made(subscribed);
                    }
                    () = sleep_until(TokioInstant::from_std(wake)) => {}
                },
                None => sleep_until(TokioInstant::from_std(wake)).await,
            },
        }
    }
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
