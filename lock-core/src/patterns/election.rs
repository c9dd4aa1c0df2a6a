//! Leader election on the lock: the leader holds the lock of the election's name, its term
//! is that lock's fencing token, and its value is the name's record, written fenced by the
//! leader's lease.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::Stream;

use crate::backend::{lock_unpoisoned, with_timeout, Ownership, Record, MAX_RETENTION};
use crate::client::guard::LockGuard;
use crate::client::request::LockRequest;
use crate::engine::held::LossReason;
use crate::engine::ClientCore;
use crate::patterns::idempotent::write_fenced;
use crate::values::error::{Error, ErrorKind, Result};
use crate::values::key::LockKey;
use crate::values::lease::FencingToken;
use crate::values::options::Backoff;

/// What a campaign asks for: the election's name and the value to lead with (the `K` of
/// a [`CampaignRequest`]).
#[derive(Clone, Debug)]
pub struct Candidate {
    name: LockKey,
    value: Vec<u8>,
}

impl Candidate {
    pub(crate) fn new(name: LockKey) -> Self {
        Candidate {
            name,
            value: Vec::new(),
        }
    }

    /// The election's name.
    pub fn name(&self) -> &LockKey {
        &self.name
    }
}

/// A campaign ([`LockClient::elect`](crate::LockClient::elect)): the lock request's
/// builder (TTL, wait, renewal, holder label) plus [`value`](Self::value); `.await` it
/// to lead, as a [`Leadership`].
pub type CampaignRequest = LockRequest<Candidate>;

impl CampaignRequest {
    /// The value to lead with, for [`LockClient::leader`](crate::LockClient::leader) and
    /// observers to read (an address, a shard list). Empty by default.
    pub fn value(mut self, value: impl Into<Vec<u8>>) -> Self {
        let value = value.into();
        self.key = self.key.map(|candidate| Candidate { value, ..candidate });
        self
    }
}

impl IntoFuture for CampaignRequest {
    type Output = Result<Leadership>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<Leadership>> + Send + 'static>>;

    fn into_future(self) -> Self::IntoFuture {
        let options = self.effective_options();
        let (core, candidate) = (self.core, self.key);
        Box::pin(async move {
            let Candidate { name, value } = candidate?;
            refuse_without_records(&core)?;
            let guard =
                LockRequest::new(Arc::clone(&core), None, Ok(name), options.clone()).await?;
            let leadership = Leadership {
                guard,
                core,
                value: Mutex::new(Vec::new()),
                limits: (options.request_timeout, options.backoff),
            };
            // Not a leader observers can read until its value is there; a leadership
            // dropped here gives the lock back with its guard.
            leadership.proclaim(value).await?;
            Ok(leadership)
        })
    }
}

fn refuse_without_records(core: &ClientCore) -> Result<()> {
    if core.backend.capabilities().records {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Unsupported,
        format!(
            "{} keeps no records, and an election keeps its leader's value in one",
            core.backend.name()
        ),
    ))
}

/// Leading an election ([`LockClient::elect`](crate::LockClient::elect)).
///
/// The leader holds the lock of the election's name, renewed by the client's renewal
/// engine; [`lost`](Self::lost) fires before any other candidate can be made leader (the
/// lock's lost signal), and [`term`](Self::term) is the lock's fencing token, strictly
/// greater than every earlier leader's. Dropping it resigns in the background.
#[derive(Debug)]
#[must_use = "dropping the leadership resigns"]
pub struct Leadership {
    guard: LockGuard,
    core: Arc<ClientCore>,
    value: Mutex<Vec<u8>>,
    /// Request time-out and backoff of the value's writes.
    limits: (Duration, Backoff),
}

impl Leadership {
    /// The election's name.
    pub fn name(&self) -> &LockKey {
        self.guard.key()
    }

    /// The lock the leader holds (the election's name): its lease, health and the like.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// This leadership's term: a fencing token strictly greater than every earlier
    /// leader's of the election. Pass it to whatever only the leader may change.
    pub fn term(&self) -> FencingToken {
        self.guard.token()
    }

    /// The value this leader last proclaimed.
    pub fn value(&self) -> Vec<u8> {
        lock_unpoisoned(&self.value).clone()
    }

    /// Whether this caller still leads (the lock's lease held, its local deadline ahead).
    /// Cheap: no store call.
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// Resolves when leadership is lost, with the reason, before any other candidate can
    /// be made leader. Never resolves after a resignation.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        self.guard.lost()
    }

    /// Changes the leader's value without a new term. [`ErrorKind::Lost`] when
    /// leadership is gone (the store refuses a write under a lease it no longer holds).
    pub async fn proclaim(&self, value: impl Into<Vec<u8>>) -> Result<()> {
        let value = value.into();
        let record = Record {
            value: value.clone(),
            fingerprint: None,
            token: self.term(),
        };
        match write_fenced(
            &self.core.backend,
            &self.guard,
            &record,
            MAX_RETENTION,
            self.limits,
        )
        .await?
        {
            Ownership::Held => {
                *lock_unpoisoned(&self.value) = value;
                Ok(())
            }
            Ownership::NotHeld => Err(Error::lost(format!(
                "leadership of {:?} is lost: the value was not proclaimed",
                self.name().as_str()
            ))),
        }
    }

    /// Hands leadership over at once: the next candidate can be elected as soon as the
    /// store has the release. `Ok` when this caller led until now, [`ErrorKind::Lost`]
    /// when leadership had been lost before.
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }

    /// Runs `body` with the term while leading, then resigns; stops `body` (drops it at its
    /// next await point) when leadership is lost, and then answers [`ErrorKind::Lost`]: what
    /// the body did after the loss was not protected, except by fencing with the term.
    pub async fn run<F, Fut, T>(self, body: F) -> Result<T>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let lost = self.lost();
        let body = body(self.term());
        tokio::select! {
            // A loss wins over a body that completes in the same poll.
            biased;
            _ = lost => {
                let resigned = self.resign().await.err();
                Err(resigned.unwrap_or_else(|| Error::lost("leadership was lost while the body ran")))
            }
            value = body => self.resign().await.map(|()| value),
        }
    }
}

/// Who leads an election now ([`LockClient::leader`](crate::LockClient::leader)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderStatus {
    /// The leader's term (its lock's fencing token).
    pub term: FencingToken,
    /// The value the leader proclaimed in this term; `None` for a leader elected a moment
    /// ago that has not written it yet.
    pub value: Option<Vec<u8>>,
    /// The leader's holder label, where the store keeps one.
    pub holder: Option<String>,
    /// Time left before the store expires the leader's lease, by the store's clock.
    pub remaining_ttl: Duration,
}

/// Who leads `name` now, by the store: its lock's holder, with the value recorded in its
/// term.
pub(crate) async fn leader(
    core: &ClientCore,
    name: &LockKey,
    request_timeout: Duration,
) -> Result<Option<LeaderStatus>> {
    refuse_without_records(core)?;
    let backend = &core.backend;
    let holder = with_timeout(
        backend.name(),
        request_timeout,
        "inspect",
        backend.inspect(name),
    )
    .await?;
    let Some(holder) = holder else {
        return Ok(None);
    };
    let record = with_timeout(
        backend.name(),
        request_timeout,
        "read_record",
        backend.read_record(name),
    )
    .await?;
    Ok(Some(LeaderStatus {
        term: holder.token,
        value: record
            .filter(|record| record.token == holder.token)
            .map(|record| record.value),
        holder: holder.holder,
        remaining_ttl: holder.remaining_ttl,
    }))
}

/// Leader changes of an election ([`LockClient::observe`](crate::LockClient::observe)):
/// [`next`](Self::next) for the next one, or use it as a [`Stream`] (it never ends).
pub struct LeaderChanges {
    changes: Pin<Box<dyn Stream<Item = Option<LeaderStatus>> + Send>>,
}

impl LeaderChanges {
    /// The next change: who leads now (the first call), then each change after the last
    /// one told; `None` when nobody leads.
    pub async fn next(&mut self) -> Option<LeaderStatus> {
        use futures_util::StreamExt;
        // The stream never ends: its looks go on for as long as it is polled.
        self.changes.next().await.flatten()
    }
}

impl Stream for LeaderChanges {
    type Item = Option<LeaderStatus>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.changes.as_mut().poll_next(cx)
    }
}

impl std::fmt::Debug for LeaderChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderChanges").finish_non_exhaustive()
    }
}

/// What an observer has told its consumer last: the term and the value.
type Told = Option<(FencingToken, Option<Vec<u8>>)>;

/// The stream of `name`'s leader changes: the current state first, then each change seen,
/// looking again at every release the store announces and at least every `every`. Terms
/// never go backwards: a look older than what was told (a lagging replica's) is skipped.
/// A failed look is retried at the next one, unreported (and logged).
pub(crate) fn observe(
    core: Arc<ClientCore>,
    name: LockKey,
    every: Duration,
    request_timeout: Duration,
) -> LeaderChanges {
    struct Observer {
        core: Arc<ClientCore>,
        name: LockKey,
        told: Option<Told>,
        highest: FencingToken,
        watch: Option<Box<dyn crate::backend::KeyWatch>>,
    }
    let observer = Observer {
        core,
        name,
        told: None,
        highest: FencingToken::new(0),
        watch: None,
    };
    let changes = Box::pin(futures_util::stream::unfold(
        observer,
        move |mut observer| async move {
            loop {
                if observer.told.is_some() {
                    pause(&mut observer.watch, &observer.core, &observer.name, every).await;
                }
                let look = match leader(&observer.core, &observer.name, request_timeout).await {
                    Ok(look) => look,
                    Err(err) => {
                        tracing::debug!(key = %observer.name, error = %err, "observing: look failed; trying again");
                        // Said at once the first time, so the consumer is not left waiting.
                        if observer.told.is_none() {
                            tokio::time::sleep(every).await;
                        }
                        continue;
                    }
                };
                let now: Told = look
                    .as_ref()
                    .map(|status| (status.term, status.value.clone()));
                if is_news(observer.told.as_ref(), observer.highest, &now) {
                    if let Some((term, _)) = &now {
                        observer.highest = observer.highest.max(*term);
                    }
                    observer.told = Some(now);
                    return Some((look, observer));
                }
            }
        },
    ));
    LeaderChanges { changes }
}

/// Whether `now` is worth telling after `told` (`None` before the first look), when
/// `highest` is the latest term told: a later term, the same term with a value that was
/// missing or changed, or no leader after one. A term below `highest`, or `highest`
/// again after no leader was told, is a stale look and never told: terms do not go back.
fn is_news(told: Option<&Told>, highest: FencingToken, now: &Told) -> bool {
    let Some(told) = told else {
        return true;
    };
    match (told, now) {
        (None, None) => false,
        (Some(_), None) => true,
        (_, Some((term, _))) if *term > highest => true,
        (Some((told_term, told_value)), Some((term, value))) => {
            term == told_term && value.is_some() && value != told_value
        }
        (None, Some(_)) => false,
    }
}

/// Waits for the next look: a release the store announces, or `every`.
async fn pause(
    watch: &mut Option<Box<dyn crate::backend::KeyWatch>>,
    core: &ClientCore,
    name: &LockKey,
    every: Duration,
) {
    if watch.is_none() && core.backend.capabilities().native_notification {
        *watch = core.backend.watch(name).await.ok().flatten();
    }
    let Some(subscribed) = watch.as_mut() else {
        tokio::time::sleep(every).await;
        return;
    };
    tokio::select! {
        changed = subscribed.changed() => if changed.is_err() {
            *watch = None;
        },
        () = tokio::time::sleep(every) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(n: u64) -> FencingToken {
        FencingToken::new(n)
    }

    /// What an observer tells: every change forward, nothing backward or repeated.
    #[test]
    fn news_goes_forward_only() {
        let leader = |n, value: Option<&str>| Some((term(n), value.map(|v| v.as_bytes().to_vec())));
        // The first look is always told, a leader or none.
        assert!(is_news(None, term(0), &None));
        assert!(is_news(None, term(0), &leader(3, Some("a"))));
        // The same state again is not news; a proclaimed value or a new term is.
        let told = leader(3, Some("a"));
        assert!(!is_news(Some(&told), term(3), &leader(3, Some("a"))));
        assert!(is_news(Some(&told), term(3), &leader(3, Some("b"))));
        assert!(is_news(Some(&told), term(3), &leader(5, None)));
        // A value missing in a look of the same term is a lagging look, not news.
        assert!(!is_news(Some(&told), term(3), &leader(3, None)));
        // An older term, or the told term again after no leader, is stale.
        assert!(!is_news(Some(&told), term(3), &leader(2, Some("z"))));
        assert!(!is_news(Some(&None), term(3), &leader(3, Some("a"))));
        assert!(is_news(Some(&None), term(3), &leader(4, Some("c"))));
        // No leader after one is news; twice is not.
        assert!(is_news(Some(&told), term(3), &None));
        assert!(!is_news(Some(&None), term(3), &None));
    }

    /// A leader's value is readable by anyone, a proclaim changes it without a new term,
    /// and a resigned leader's proclaim is refused.
    #[tokio::test]
    async fn proclaim_changes_the_value_within_the_term() {
        let client = crate::LockClient::new(crate::MemoryBackend::new());
        let leadership = client.elect("e").value("first").await.unwrap();
        leadership.proclaim("second").await.unwrap();
        let seen = client.leader("e").await.unwrap().unwrap();
        assert_eq!(seen.term, leadership.term());
        assert_eq!(seen.value.as_deref(), Some(&b"second"[..]));
        assert_eq!(leadership.value(), b"second");
        let other = client.elect("e").value("next");
        let (resigned, next) = tokio::join!(leadership.resign(), other.into_future());
        resigned.unwrap();
        let next = next.unwrap();
        assert!(next.term() > seen.term);
        next.resign().await.unwrap();
    }
}
