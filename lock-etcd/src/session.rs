//! The client's etcd leases ("sessions"): one per distinct TTL for automatically renewed
//! locks, one per lock renewed by hand, each kept alive over one keep-alive stream that
//! stays open.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use futures_util::stream::{FuturesUnordered, StreamExt};
use lock_core::backend::{lock_unpoisoned as lock, AcquireRequest, SessionKeeper};
use lock_core::{Error, ErrorKind, LeaseId, Renewal, Result};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep_until, timeout, Instant as TokioInstant};

use crate::error::{is_lease_not_found, map, timed_out};

/// Which session an acquisition lives by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SessionKind {
    /// Shared by the client's automatically renewed locks of one TTL (in whole seconds).
    Shared(u64),
    /// A lock of its own: renewed by hand (only its renewals keep it alive, so it expires
    /// by its own TTL), or in the etcd-mutex layout, where the entry is named by its lease.
    Own(LeaseId),
}

/// A keep-alive asked for by a renewal: answered with whether the lease is still alive,
/// only by a keep-alive sent no earlier than it was asked for (the core counts the renewed
/// deadline from before it asked, so an older keep-alive would stretch the deadline past
/// the server's expiry).
#[derive(Debug)]
struct Ping {
    asked_at: Instant,
    answer: oneshot::Sender<Result<bool>>,
}

impl Ping {
    fn reply(self, answer: Result<bool>) {
        // The renewal may have given up waiting: nobody to tell.
        let _ = self.answer.send(answer);
    }
}

/// Splits `pings` into those a keep-alive sent at `sent_at` answers (asked for no later)
/// and those that need a keep-alive of their own.
fn answered_by(pings: Vec<Ping>, sent_at: Instant) -> (Vec<Ping>, Vec<Ping>) {
    pings.into_iter().partition(|ping| ping.asked_at <= sent_at)
}

/// One etcd lease of this client.
#[derive(Debug)]
pub(crate) struct EtcdSession {
    /// The etcd lease id entries are attached to.
    pub(crate) lease: i64,
    pub(crate) keeper: SessionKeeper,
    pings: mpsc::UnboundedSender<Ping>,
}

impl EtcdSession {
    /// A session of etcd lease `lease` with no keep-alive task, for unit tests.
    #[cfg(test)]
    pub(crate) fn detached(lease: i64) -> Self {
        EtcdSession {
            lease,
            keeper: SessionKeeper::new(Instant::now(), Duration::from_secs(10)),
            pings: mpsc::unbounded_channel().0,
        }
    }

    /// The store ended the lease: every entry on it is gone.
    pub(crate) fn ended(&self) {
        self.keeper.expired();
    }

    /// Sends one keep-alive now (on the session's stream) and waits for its answer:
    /// `false` when the lease is gone.
    pub(crate) async fn ping(&self) -> Result<bool> {
        let (answer, answered) = oneshot::channel();
        self.pings
            .send(Ping {
                asked_at: Instant::now(),
                answer,
            })
            .map_err(|_| Error::new(ErrorKind::Unavailable, "etcd: the session has ended"))?;
        answered
            .await
            .map_err(|_| Error::new(ErrorKind::Unavailable, "etcd: the session has ended"))?
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<Arc<EtcdSession>>>>;

/// Every session of one client.
pub(crate) struct Sessions {
    client: Client,
    request_timeout: Duration,
    slots: Mutex<HashMap<SessionKind, Slot>>,
}

impl Sessions {
    pub(crate) fn new(client: Client, request_timeout: Duration) -> Self {
        Sessions {
            client,
            request_timeout,
            slots: Mutex::default(),
        }
    }

    /// The kind of session `request` lives by.
    pub(crate) fn kind(request: &AcquireRequest, own: bool, ttl_secs: u64) -> SessionKind {
        if own || request.renewal() == Renewal::Manual {
            SessionKind::Own(request.lease_id())
        } else {
            SessionKind::Shared(ttl_secs)
        }
    }

    /// The live session of `kind`, granting a new etcd lease when there is none (a
    /// session the store ended is never reused). `ticking` sessions keep themselves
    /// alive; the others only when pinged.
    pub(crate) async fn session(
        &self,
        kind: SessionKind,
        ttl: Duration,
        ticking: bool,
    ) -> Result<Arc<EtcdSession>> {
        let slot = Arc::clone(lock(&self.slots).entry(kind).or_default());
        let mut current = slot.lock().await;
        if let Some(session) = current.as_ref() {
            if !session.keeper.status().expired {
                return Ok(Arc::clone(session));
            }
        }
        let sent_at = Instant::now();
        let secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        let granted = timeout(
            self.request_timeout,
            self.client.lease_client().grant(secs, None),
        )
        .await
        .map_err(|_| timed_out("granting a lease"))?
        .map_err(|err| map("granting a lease", err))?;
        let (pings, pinged) = mpsc::unbounded_channel();
        let session = Arc::new(EtcdSession {
            lease: granted.id(),
            keeper: SessionKeeper::new(sent_at, ttl),
            pings,
        });
        tracing::debug!(lease = granted.id(), ?kind, ?ttl, "etcd lease granted");
        tokio::spawn(keep_alive(
            self.client.clone(),
            session.lease,
            Arc::downgrade(&session),
            KeepAliveTiming {
                interval: ttl / 4,
                request_timeout: self.request_timeout,
                // Slow answers still prove the lease alive from their send time, so a
                // stream is only given up when it is silent for much longer than that.
                stale_after: (ttl * 3).max(self.request_timeout),
                ticking,
            },
            pinged,
        ));
        *current = Some(Arc::clone(&session));
        Ok(session)
    }

    /// The open session whose etcd lease is `lease`, if any.
    pub(crate) fn by_lease(&self, lease: i64) -> Option<Arc<EtcdSession>> {
        let slots: Vec<Slot> = lock(&self.slots).values().cloned().collect();
        slots.into_iter().find_map(|slot| {
            let current = slot.try_lock().ok()?;
            current.as_ref().filter(|s| s.lease == lease).cloned()
        })
    }

    /// The live sessions shared by automatically renewed locks (one per TTL in use). A
    /// session being opened right now is not among them.
    pub(crate) fn live_shared(&self) -> Vec<Arc<EtcdSession>> {
        let slots: Vec<Slot> = lock(&self.slots)
            .iter()
            .filter(|(kind, _)| matches!(kind, SessionKind::Shared(_)))
            .map(|(_, slot)| Arc::clone(slot))
            .collect();
        slots
            .into_iter()
            .filter_map(|slot| {
                let current = slot.try_lock().ok()?;
                current
                    .as_ref()
                    .filter(|s| !s.keeper.status().expired)
                    .cloned()
            })
            .collect()
    }

    /// Ends a lock's own session in the background: its etcd lease is revoked (an entry
    /// left on it goes with it).
    pub(crate) fn end_own(&self, lease_id: LeaseId) {
        let Some(slot) = lock(&self.slots).remove(&SessionKind::Own(lease_id)) else {
            return;
        };
        let (client, bound) = (self.client.clone(), self.request_timeout);
        tokio::spawn(async move {
            if let Some(session) = slot.lock().await.take() {
                let _ = revoke(client, session.lease, bound).await;
            }
        });
    }

    /// Ends a lock's own session now, if this client has one for `lease_id`: revoking its
    /// etcd lease deletes the lock's entry in the same step. `Some(true)` if the lease
    /// (and so the entry) was still there, `None` when there is no such session.
    pub(crate) async fn revoke_own(&self, lease_id: LeaseId) -> Option<Result<bool>> {
        let slot = lock(&self.slots).remove(&SessionKind::Own(lease_id))?;
        let session = slot.lock().await.take()?;
        session.ended();
        Some(revoke(self.client.clone(), session.lease, self.request_timeout).await)
    }
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("open", &lock(&self.slots).len())
            .finish_non_exhaustive()
    }
}

impl Drop for Sessions {
    /// The client is gone: revoke its leases so its entries go now, not a TTL later.
    fn drop(&mut self) {
        let slots: Vec<Slot> = lock(&self.slots).drain().map(|(_, slot)| slot).collect();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, bound) = (self.client.clone(), self.request_timeout);
        runtime.spawn(async move {
            for slot in slots {
                if let Some(session) = slot.lock().await.take() {
                    let _ = revoke(client.clone(), session.lease, bound).await;
                }
            }
        });
    }
}

/// Revokes an etcd lease: `false` when the store no longer had it.
async fn revoke(client: Client, lease: i64, bound: Duration) -> Result<bool> {
    match timeout(bound, client.lease_client().revoke(lease)).await {
        Ok(Ok(_)) => Ok(true),
        Ok(Err(err)) if is_lease_not_found(&err) => Ok(false),
        Ok(Err(err)) => {
            tracing::debug!(lease, error = %err, "revoking an etcd lease failed; it expires by its TTL");
            Err(map("revoking a lease", err))
        }
        Err(_) => Err(timed_out("revoking a lease")),
    }
}

#[derive(Clone, Copy)]
struct KeepAliveTiming {
    interval: Duration,
    request_timeout: Duration,
    /// How long a keep-alive may go unanswered before its stream counts as dead.
    stale_after: Duration,
    /// Sends a keep-alive every interval by itself (else only when pinged).
    ticking: bool,
}

/// The open keep-alive stream of a session and the keep-alives sent on it and not yet
/// answered, oldest first (etcd answers a stream's keep-alives in order).
struct Stream {
    keeper: LeaseKeeper,
    replies: LeaseKeepAliveStream,
    pending: VecDeque<(Instant, Option<Ping>)>,
}

/// Keeps one session alive over one stream, reopened when it breaks. Reports every
/// answered keep-alive with its *send* time, a stream that went quiet or broke as
/// disconnected, and a lease the store no longer has (TTL <= 0) as expired, which ends
/// the task. Also ends when the session is dropped.
async fn keep_alive(
    client: Client,
    lease: i64,
    session: Weak<EtcdSession>,
    timing: KeepAliveTiming,
    mut pinged: mpsc::UnboundedReceiver<Ping>,
) {
    let mut stream: Option<Stream> = None;
    // Opens still under way after another one won: their answers count too.
    let mut opens: FuturesUnordered<OpenAttempt> = FuturesUnordered::new();
    let mut waiting: Vec<Ping> = Vec::new();
    let mut next_tick = TokioInstant::now() + timing.interval;
    let mut pause = Duration::from_millis(50);
    loop {
        if session.strong_count() == 0 {
            return;
        }
        if stream.is_none() && (timing.ticking || !waiting.is_empty()) {
            let opened = open_stream(
                &client,
                lease,
                timing,
                &mut opens,
                &mut pinged,
                &mut waiting,
            )
            .await;
            let Some(current) = session.upgrade() else {
                return;
            };
            match opened {
                Opened::Stream(open, sent_at) => {
                    current.keeper.kept_alive(sent_at);
                    drop(current);
                    // The open may have been sent before some pings were asked for (an
                    // earlier or hedged attempt): those get a keep-alive of their own.
                    let (proven, later) = answered_by(std::mem::take(&mut waiting), sent_at);
                    proven.into_iter().for_each(|ping| ping.reply(Ok(true)));
                    let open = stream.insert(*open);
                    let mut later = later.into_iter();
                    for ping in later.by_ref() {
                        if !send(open, Some(ping)).await {
                            broken(&session, &mut stream, "the keep-alive stream closed");
                            break;
                        }
                    }
                    waiting.extend(later);
                    next_tick = TokioInstant::now() + timing.interval;
                    pause = Duration::from_millis(50);
                }
                Opened::Gone => {
                    current.ended();
                    waiting.drain(..).for_each(|ping| ping.reply(Ok(false)));
                    return;
                }
                Opened::Closed => return,
                Opened::Failed(err) => {
                    current.keeper.disconnected();
                    tracing::debug!(lease, error = %err, "keep-alive stream failed; retrying");
                    waiting
                        .drain(..)
                        .for_each(|ping| ping.reply(Err(err.clone())));
                    drop(current);
                    // Pings that arrive meanwhile wait for the next attempt.
                    let resume = TokioInstant::now() + pause;
                    pause = (pause * 2).min(timing.interval.max(Duration::from_millis(50)));
                    loop {
                        tokio::select! {
                            () = sleep_until(resume) => break,
                            ping = pinged.recv() => match ping {
                                Some(ping) => waiting.push(ping),
                                None => return,
                            },
                        }
                    }
                    continue;
                }
            }
        }
        let Some(open) = stream.as_mut() else {
            match pinged.recv().await {
                Some(ping) => waiting.push(ping),
                None => return,
            }
            continue;
        };
        // A keep-alive unanswered for three TTLs (or a request time-out): the stream is
        // dead (a silent partition), so open a new one.
        let stale_at = open
            .pending
            .front()
            .map(|(sent, _)| TokioInstant::from_std(*sent) + timing.stale_after);
        tokio::select! {
            () = sleep_until(next_tick), if timing.ticking => {
                next_tick += timing.interval;
                if !open.pending.is_empty() {
                    if let Some(current) = session.upgrade() {
                        current.keeper.disconnected();
                    }
                }
                if !send(open, None).await {
                    broken(&session, &mut stream, "the keep-alive stream closed");
                }
            }
            ping = pinged.recv() => match ping {
                Some(ping) => {
                    if !send(open, Some(ping)).await {
                        broken(&session, &mut stream, "the keep-alive stream closed");
                    }
                }
                None => return,
            },
            () = sleep_until(stale_at.unwrap_or_else(|| TokioInstant::now() + timing.stale_after)), if stale_at.is_some() => {
                broken(&session, &mut stream, "a keep-alive went unanswered");
            }
            opened = opens.next(), if !opens.is_empty() => match opened {
                Some((sent_at, Ok(Ok(_)))) => {
                    if let Some(current) = session.upgrade() {
                        current.keeper.kept_alive(sent_at);
                    }
                }
                Some((_, Ok(Err(err)))) if is_lease_not_found(&err) => {
                    if let Some(current) = session.upgrade() {
                        current.ended();
                    }
                    answer_all(stream.take(), Ok(false), None);
                    return;
                }
                _ => {}
            },
            reply = open.replies.message() => match reply {
                Ok(Some(reply)) => {
                    let answered = open.pending.pop_front();
                    let Some(current) = session.upgrade() else { return };
                    if reply.ttl() <= 0 {
                        current.ended();
                        answer_all(stream.take(), Ok(false), answered.and_then(|(_, ping)| ping));
                        return;
                    }
                    // etcd answers only what was sent, so an answer with nothing
                    // outstanding proves nothing about when the lease was kept alive.
                    let Some((sent_at, ping)) = answered else {
                        tracing::debug!(lease, "keep-alive answer with none outstanding; ignored");
                        continue;
                    };
                    current.keeper.kept_alive(sent_at);
                    if let Some(ping) = ping {
                        ping.reply(Ok(true));
                    }
                }
                Ok(None) => broken(&session, &mut stream, "the keep-alive stream ended"),
                Err(err) => {
                    tracing::debug!(error = %err, "keep-alive stream failed");
                    broken(&session, &mut stream, "the keep-alive stream failed");
                }
            },
        }
    }
}

/// How opening a keep-alive stream ended.
enum Opened {
    /// Open, its first keep-alive (sent at the instant) answered.
    Stream(Box<Stream>, Instant),
    /// The store no longer has the lease.
    Gone,
    /// Every attempt failed.
    Failed(Error),
    /// The session was dropped meanwhile.
    Closed,
}

/// One attempt to open a keep-alive stream: its send time and what came of it.
type OpenAttempt = Pin<
    Box<
        dyn Future<
                Output = (
                    Instant,
                    std::result::Result<
                        std::result::Result<
                            (LeaseKeeper, LeaseKeepAliveStream),
                            etcd_client::Error,
                        >,
                        tokio::time::error::Elapsed,
                    >,
                ),
            > + Send,
    >,
>;

fn open_attempt(client: &Client, lease: i64, bound: Duration) -> OpenAttempt {
    let client = client.clone();
    Box::pin(async move {
        let sent_at = Instant::now();
        let opened = timeout(bound, client.lease_client().keep_alive(lease)).await;
        (sent_at, opened)
    })
}

/// Opens a keep-alive stream; opening sends its first keep-alive and waits for the answer,
/// so nothing else can be sent meanwhile. When that answer is slow, a ticking session
/// opens another stream every interval (at most three at once) and keeps the first one
/// answered; the others stay in `attempts`, and their answers still prove the lease alive
/// from when they were sent, so a deadline never waits on one slow open.
async fn open_stream(
    client: &Client,
    lease: i64,
    timing: KeepAliveTiming,
    attempts: &mut FuturesUnordered<OpenAttempt>,
    pinged: &mut mpsc::UnboundedReceiver<Ping>,
    waiting: &mut Vec<Ping>,
) -> Opened {
    attempts.push(open_attempt(client, lease, timing.request_timeout));
    let mut hedge_at = TokioInstant::now() + timing.interval;
    loop {
        tokio::select! {
            done = attempts.next() => match done {
                Some((sent_at, Ok(Ok((keeper, replies))))) => {
                    let open = Stream { keeper, replies, pending: VecDeque::new() };
                    return Opened::Stream(Box::new(open), sent_at);
                }
                Some((_, Ok(Err(err)))) if is_lease_not_found(&err) => return Opened::Gone,
                Some((_, failed)) => {
                    if attempts.is_empty() {
                        return Opened::Failed(match failed {
                            Ok(Err(err)) => map("keeping a lease alive", err),
                            _ => timed_out("keeping a lease alive"),
                        });
                    }
                }
                None => return Opened::Failed(timed_out("keeping a lease alive")),
            },
            () = sleep_until(hedge_at), if timing.ticking && attempts.len() < 3 => {
                attempts.push(open_attempt(client, lease, timing.request_timeout));
                hedge_at += timing.interval;
            }
            ping = pinged.recv() => match ping {
                Some(ping) => waiting.push(ping),
                None => return Opened::Closed,
            },
        }
    }
}

/// Sends one keep-alive on the stream; `false` when the stream is closed.
async fn send(open: &mut Stream, ping: Option<Ping>) -> bool {
    let sent_at = Instant::now();
    if open.keeper.keep_alive().await.is_err() {
        if let Some(ping) = ping {
            open.pending.push_back((sent_at, Some(ping)));
        }
        return false;
    }
    open.pending.push_back((sent_at, ping));
    true
}

/// Drops a broken stream: the session counts as disconnected until a new one answers,
/// and renewals waiting on the old one are told it is unavailable.
fn broken(session: &Weak<EtcdSession>, stream: &mut Option<Stream>, why: &'static str) {
    if let Some(current) = session.upgrade() {
        current.keeper.disconnected();
    }
    tracing::debug!(why, "etcd keep-alive stream dropped");
    answer_all(
        stream.take(),
        Err(Error::new(ErrorKind::Unavailable, format!("etcd: {why}"))),
        None,
    );
}

fn answer_all(stream: Option<Stream>, answer: Result<bool>, extra: Option<Ping>) {
    let pending = stream.map(|s| s.pending).unwrap_or_default();
    for ping in pending
        .into_iter()
        .filter_map(|(_, ping)| ping)
        .chain(extra)
    {
        ping.reply(answer.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ping(asked_at: Instant) -> (Ping, oneshot::Receiver<Result<bool>>) {
        let (answer, answered) = oneshot::channel();
        (Ping { asked_at, answer }, answered)
    }

    /// N6: a stream whose opening keep-alive went out before a renewal asked for one does
    /// not answer that renewal; one asked for before (or at) the send does.
    #[test]
    fn a_ping_is_answered_only_by_a_keep_alive_sent_after_it() {
        let opened_at = Instant::now();
        let (before, _) = ping(opened_at - Duration::from_millis(5));
        let (at, _) = ping(opened_at);
        let (after, _) = ping(opened_at + Duration::from_millis(5));
        let (proven, later) = answered_by(vec![before, after, at], opened_at);
        let asked = |pings: &[Ping]| pings.iter().map(|p| p.asked_at).collect::<Vec<_>>();
        assert_eq!(
            asked(&proven),
            [opened_at - Duration::from_millis(5), opened_at]
        );
        assert_eq!(asked(&later), [opened_at + Duration::from_millis(5)]);
    }
}
