//! The client's etcd leases ("sessions"), pooled by the core's [`SessionPool`]: one per
//! distinct TTL for automatically renewed locks, one per lock renewed by hand. What is
//! etcd's here: a lease grant, and a keep-alive stream that stays open, reopened (with
//! hedged opens) when it breaks.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use futures_util::stream::{FuturesUnordered, StreamExt};
use lock_core::backend::{
    async_trait, lock_unpoisoned as lock, with_timeout, AcquireRequest, KeepAliveSpan,
    PooledSession, Restarts, SessionKeeper, SessionKind, SessionNews, SessionPool, SessionStore,
};
use lock_core::{Backoff, Error, ErrorKind, LeaseId, Result};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep_until, Instant as TokioInstant};
use tracing::Instrument;

use crate::error::{into_error, is_lease_not_found};

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
    /// Taken by the session's keep-alive task.
    pinged: Mutex<Option<mpsc::UnboundedReceiver<Ping>>>,
}

impl PooledSession for EtcdSession {
    fn keeper(&self) -> &SessionKeeper {
        &self.keeper
    }
}

impl EtcdSession {
    fn new(lease: i64, keeper: SessionKeeper) -> Self {
        let (pings, pinged) = mpsc::unbounded_channel();
        EtcdSession {
            lease,
            keeper,
            pings,
            pinged: Mutex::new(Some(pinged)),
        }
    }

    /// A session of etcd lease `lease` with no keep-alive task, for unit tests.
    #[cfg(test)]
    pub(crate) fn detached(lease: i64) -> Self {
        EtcdSession::new(
            lease,
            SessionKeeper::new(Instant::now(), Duration::from_secs(10)),
        )
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

/// Every session of one client. Dropping it revokes their leases, so their entries go
/// now, not a TTL later.
#[derive(Debug)]
pub(crate) struct Sessions {
    pool: SessionPool<EtcdStore>,
}

impl Sessions {
    pub(crate) fn new(client: Client, request_timeout: Duration) -> Self {
        Sessions {
            pool: SessionPool::new(EtcdStore {
                client,
                request_timeout,
            }),
        }
    }

    /// The live session `request` lives by (of `ttl`, whole seconds), granting a new etcd
    /// lease when there is none. `own`: every lock has a lease of its own (the etcd-mutex
    /// layout, where the entry is named by its lease).
    pub(crate) async fn session(
        &self,
        request: &AcquireRequest,
        own: bool,
        ttl: Duration,
    ) -> Result<Arc<EtcdSession>> {
        let kind = if own {
            SessionKind::own(request)
        } else {
            SessionKind::shared(request, ttl)
        };
        self.pool.session(kind, ttl).await
    }

    /// The open session whose etcd lease is `lease`, if any.
    pub(crate) fn by_lease(&self, lease: i64) -> Option<Arc<EtcdSession>> {
        self.pool
            .sessions()
            .into_iter()
            .find_map(|(_, session)| (session.lease == lease).then_some(session))
    }

    /// The live sessions shared by automatically renewed locks (one per TTL in use). A
    /// session being opened right now is not among them.
    pub(crate) fn live_shared(&self) -> Vec<Arc<EtcdSession>> {
        self.pool
            .sessions()
            .into_iter()
            .filter(|(kind, session)| {
                matches!(kind, SessionKind::Shared(_)) && !session.keeper.status().expired
            })
            .map(|(_, session)| session)
            .collect()
    }

    /// Ends a lock's own session in the background: its etcd lease is revoked (an entry
    /// left on it goes with it).
    pub(crate) fn end_own(&self, lease_id: LeaseId) {
        self.pool.close_own(lease_id);
    }

    /// Ends a lock's own session now, if this client has one for `lease_id`: revoking its
    /// etcd lease deletes the lock's entry in the same step. `Some(true)` if the lease
    /// (and so the entry) was still there, `None` when there is no such session.
    pub(crate) async fn revoke_own(&self, lease_id: LeaseId) -> Option<Result<bool>> {
        let session = self.pool.take_own(lease_id).await?;
        session.ended();
        let store = self.pool.store();
        Some(revoke(&store.client, session.lease, store.request_timeout).await)
    }
}

/// etcd's side of the pool.
struct EtcdStore {
    client: Client,
    request_timeout: Duration,
}

#[async_trait]
impl SessionStore for EtcdStore {
    type Session = EtcdSession;

    fn name(&self) -> &'static str {
        "etcd"
    }

    /// Grants an etcd lease of `ttl` (whole seconds).
    async fn open(&self, kind: SessionKind, ttl: Duration) -> Result<EtcdSession> {
        let sent_at = Instant::now();
        let secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        let granting = async {
            self.client
                .lease_client()
                .grant(secs, None)
                .await
                .map_err(|err| into_error(err, "granting a lease"))
        };
        let granted =
            with_timeout("etcd", self.request_timeout, "granting a lease", granting).await?;
        tracing::debug!(lease = granted.id(), ?kind, ?ttl, "etcd lease granted");
        Ok(EtcdSession::new(
            granted.id(),
            SessionKeeper::new(sent_at, ttl),
        ))
    }

    /// One keep-alive on a stream of its own (opening a stream sends one and waits for
    /// its answer). The pool's sessions are served by [`serve`](Self::serve) instead,
    /// over one stream that stays open.
    async fn keep_alive(&self, session: &EtcdSession) -> SessionNews {
        let opening = async { Ok(self.client.lease_client().keep_alive(session.lease).await) };
        news_of(&with_timeout("etcd", self.request_timeout, "a keep-alive", opening).await)
    }

    async fn serve(self: Arc<Self>, kind: SessionKind, session: Weak<EtcdSession>) {
        let Some((pinged, ttl, id)) = session.upgrade().and_then(|current| {
            let pinged = lock(&current.pinged).take()?;
            let id = current.keeper.session().id();
            Some((pinged, current.keeper.status().ttl, id))
        }) else {
            return;
        };
        let interval = ttl / 4;
        KeepAlive {
            client: self.client.clone(),
            session,
            timing: KeepAliveTiming {
                interval,
                request_timeout: self.request_timeout,
                // Slow answers still prove the lease alive from their send time, so a
                // stream is only given up when it is silent for much longer than that.
                stale_after: (ttl * 3).max(self.request_timeout),
                ticking: kind.kept_alive(),
            },
            trips: Trips { kind, session: id },
            pinged,
            stream: None,
            opens: FuturesUnordered::new(),
            waiting: Vec::new(),
            next_tick: TokioInstant::now() + interval,
            restarts: Restarts::new(Backoff {
                initial: Duration::from_millis(50),
                max: interval.max(Duration::from_millis(50)),
            }),
        }
        .run()
        .await;
    }

    /// Revokes the session's etcd lease.
    async fn close(&self, session: Arc<EtcdSession>) {
        let _ = revoke(&self.client, session.lease, self.request_timeout).await;
    }
}

/// Revokes an etcd lease: `false` when the store no longer had it.
async fn revoke(client: &Client, lease: i64, bound: Duration) -> Result<bool> {
    let revoking = async { Ok(client.lease_client().revoke(lease).await) };
    match with_timeout("etcd", bound, "revoking a lease", revoking).await? {
        Ok(_) => Ok(true),
        Err(err) if is_lease_not_found(&err) => Ok(false),
        Err(err) => {
            tracing::debug!(lease, error = %err, "revoking an etcd lease failed; it expires by its TTL");
            Err(into_error(err, "revoking a lease"))
        }
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

/// What the `distlock.keep_alive` span of each keep-alive of one session names.
#[derive(Clone, Copy)]
struct Trips {
    kind: SessionKind,
    session: u64,
}

impl Trips {
    /// The span of a keep-alive sent now.
    fn start(self) -> KeepAliveSpan {
        KeepAliveSpan::new("etcd", self.kind, self.session)
    }
}

/// A keep-alive sent on a stream and not answered yet.
struct Sent {
    at: Instant,
    /// The renewal waiting for it, if any.
    ping: Option<Ping>,
    trip: KeepAliveSpan,
}

impl Sent {
    /// Ends the round trip with what it heard; the renewal waiting for it is for the
    /// caller to answer.
    fn heard(self, news: SessionNews) -> Option<Ping> {
        self.trip.heard(news);
        self.ping
    }
}

/// The open keep-alive stream of a session and the keep-alives sent on it and not yet
/// answered, oldest first (etcd answers a stream's keep-alives in order).
struct Stream {
    keeper: LeaseKeeper,
    replies: LeaseKeepAliveStream,
    pending: VecDeque<Sent>,
}

/// Keeps one session alive over one stream, reopened when it breaks. Reports every
/// answered keep-alive with its *send* time, a stream that went quiet or broke as
/// disconnected, and a lease the store no longer has (TTL <= 0) as expired, which ends
/// the task. Also ends when the session is dropped.
struct KeepAlive {
    client: Client,
    session: Weak<EtcdSession>,
    timing: KeepAliveTiming,
    trips: Trips,
    pinged: mpsc::UnboundedReceiver<Ping>,
    stream: Option<Stream>,
    /// Opens still under way after another one won: their answers count too.
    opens: FuturesUnordered<OpenAttempt>,
    /// Pings waiting for a stream.
    waiting: Vec<Ping>,
    next_tick: TokioInstant,
    /// Pauses between failed opens.
    restarts: Restarts,
}

impl KeepAlive {
    async fn run(mut self) {
        loop {
            if self.session.strong_count() == 0 {
                return;
            }
            let step = if self.stream.is_none() && (self.timing.ticking || !self.waiting.is_empty())
            {
                self.open().await
            } else {
                self.serve().await
            };
            if step.is_none() {
                return;
            }
        }
    }

    /// The open step: opens a stream, answers the pings it proves, and after a failed
    /// open pauses (collecting pings) before the next.
    async fn open(&mut self) -> Option<()> {
        let lease = self.lease()?;
        let opened = open_stream(
            &self.client,
            lease,
            self.timing,
            self.trips,
            &mut self.opens,
            &mut self.pinged,
            &mut self.waiting,
        )
        .await;
        let current = self.session.upgrade()?;
        match opened {
            Opened::Stream(open, sent_at) => {
                current.keeper.kept_alive(sent_at);
                drop(current);
                // The open may have been sent before some pings were asked for (an
                // earlier or hedged attempt): those get a keep-alive of their own.
                let (proven, later) = answered_by(std::mem::take(&mut self.waiting), sent_at);
                proven.into_iter().for_each(|ping| ping.reply(Ok(true)));
                let open = self.stream.insert(*open);
                let mut later = later.into_iter();
                for ping in later.by_ref() {
                    if !send(open, Some(ping), self.trips.start()).await {
                        broken(
                            &self.session,
                            &mut self.stream,
                            "the keep-alive stream closed",
                        );
                        break;
                    }
                }
                self.waiting.extend(later);
                self.next_tick = TokioInstant::now() + self.timing.interval;
                self.restarts.progressed();
                Some(())
            }
            Opened::Gone => {
                current.ended();
                self.waiting
                    .drain(..)
                    .for_each(|ping| ping.reply(Ok(false)));
                None
            }
            Opened::Closed => None,
            Opened::Failed(err) => {
                current.keeper.disconnected();
                tracing::debug!(lease, error = %err, "keep-alive stream failed; retrying");
                self.waiting
                    .drain(..)
                    .for_each(|ping| ping.reply(Err(err.clone())));
                drop(current);
                // Pings that arrive meanwhile wait for the next attempt.
                let resume = TokioInstant::now() + self.restarts.next_pause();
                loop {
                    tokio::select! {
                        () = sleep_until(resume) => return Some(()),
                        ping = self.pinged.recv() => self.waiting.push(ping?),
                    }
                }
            }
        }
    }

    /// The serve step: one event on the open stream (a tick, a ping, an answer, a silence
    /// too long, a late hedged open), or without a stream the next ping.
    async fn serve(&mut self) -> Option<()> {
        let lease = self.lease()?;
        let Some(open) = self.stream.as_mut() else {
            let ping = self.pinged.recv().await?;
            self.waiting.push(ping);
            return Some(());
        };
        let session = &self.session;
        // A keep-alive unanswered for three TTLs (or a request time-out): the stream is
        // dead (a silent partition), so open a new one.
        let stale_at = open
            .pending
            .front()
            .map(|sent| TokioInstant::from_std(sent.at) + self.timing.stale_after);
        tokio::select! {
            () = sleep_until(self.next_tick), if self.timing.ticking => {
                self.next_tick += self.timing.interval;
                if !open.pending.is_empty() {
                    if let Some(current) = session.upgrade() {
                        current.keeper.disconnected();
                    }
                }
                if !send(open, None, self.trips.start()).await {
                    broken(session, &mut self.stream, "the keep-alive stream closed");
                }
            }
            ping = self.pinged.recv() => {
                if !send(open, Some(ping?), self.trips.start()).await {
                    broken(session, &mut self.stream, "the keep-alive stream closed");
                }
            }
            () = sleep_until(stale_at.unwrap_or_else(|| TokioInstant::now() + self.timing.stale_after)), if stale_at.is_some() => {
                broken(session, &mut self.stream, "a keep-alive went unanswered");
            }
            opened = self.opens.next(), if !self.opens.is_empty() => match opened {
                Some((sent_at, Ok(Ok(_)))) => {
                    if let Some(current) = session.upgrade() {
                        current.keeper.kept_alive(sent_at);
                    }
                }
                Some((_, Ok(Err(err)))) if is_lease_not_found(&err) => {
                    if let Some(current) = session.upgrade() {
                        current.ended();
                    }
                    answer_all(self.stream.take(), Ok(false), None);
                    return None;
                }
                _ => {}
            },
            reply = open.replies.message() => match reply {
                Ok(Some(reply)) => {
                    let answered = open.pending.pop_front();
                    let current = session.upgrade()?;
                    if reply.ttl() <= 0 {
                        current.ended();
                        let ping = answered.and_then(|sent| sent.heard(SessionNews::Ended));
                        answer_all(self.stream.take(), Ok(false), ping);
                        return None;
                    }
                    // etcd answers only what was sent, so an answer with nothing
                    // outstanding proves nothing about when the lease was kept alive.
                    let Some(sent) = answered else {
                        tracing::debug!(lease, "keep-alive answer with none outstanding; ignored");
                        return Some(());
                    };
                    current.keeper.kept_alive(sent.at);
                    if let Some(ping) = sent.heard(SessionNews::Alive) {
                        ping.reply(Ok(true));
                    }
                }
                Ok(None) => broken(session, &mut self.stream, "the keep-alive stream ended"),
                Err(err) => {
                    tracing::debug!(error = %err, "keep-alive stream failed");
                    broken(session, &mut self.stream, "the keep-alive stream failed");
                }
            },
        }
        Some(())
    }

    /// The session's etcd lease, while the session lives (`None` ends the task, as every
    /// step's `None` does).
    fn lease(&self) -> Option<i64> {
        self.session.upgrade().map(|current| current.lease)
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

/// One attempt to open a keep-alive stream: its send time and what came of it (an error
/// of its own, or none in time).
type OpenAttempt = Pin<
    Box<
        dyn Future<
                Output = (
                    Instant,
                    Result<
                        std::result::Result<
                            (LeaseKeeper, LeaseKeepAliveStream),
                            etcd_client::Error,
                        >,
                    >,
                ),
            > + Send,
    >,
>;

/// Opening a stream sends its first keep-alive: a round trip of its own (`trip`).
fn open_attempt(client: &Client, lease: i64, bound: Duration, trip: KeepAliveSpan) -> OpenAttempt {
    let client = client.clone();
    Box::pin(async move {
        let sent_at = Instant::now();
        let opening = async { Ok(client.lease_client().keep_alive(lease).await) };
        let opened = with_timeout("etcd", bound, "keeping a lease alive", opening)
            .instrument(trip.span().clone())
            .await;
        trip.heard(news_of(&opened));
        (sent_at, opened)
    })
}

/// What a keep-alive's answer (or its absence) says of the session.
fn news_of<T>(answer: &Result<std::result::Result<T, etcd_client::Error>>) -> SessionNews {
    match answer {
        Ok(Ok(_)) => SessionNews::Alive,
        Ok(Err(err)) if is_lease_not_found(err) => SessionNews::Ended,
        _ => SessionNews::Unanswered,
    }
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
    trips: Trips,
    attempts: &mut FuturesUnordered<OpenAttempt>,
    pinged: &mut mpsc::UnboundedReceiver<Ping>,
    waiting: &mut Vec<Ping>,
) -> Opened {
    attempts.push(open_attempt(
        client,
        lease,
        timing.request_timeout,
        trips.start(),
    ));
    let mut hedge_at = TokioInstant::now() + timing.interval;
    loop {
        tokio::select! {
            done = attempts.next() => match done {
                Some((sent_at, Ok(Ok((keeper, replies))))) => {
                    let open = Stream { keeper, replies, pending: VecDeque::new() };
                    return Opened::Stream(Box::new(open), sent_at);
                }
                Some((_, Ok(Err(err)))) if is_lease_not_found(&err) => return Opened::Gone,
                Some((_, Ok(Err(err)))) if attempts.is_empty() => {
                    return Opened::Failed(into_error(err, "keeping a lease alive"));
                }
                Some((_, Err(unanswered))) if attempts.is_empty() => {
                    return Opened::Failed(unanswered);
                }
                // Another attempt is still under way.
                Some(_) => {}
                None => {
                    return Opened::Failed(Error::new(
                        ErrorKind::Unavailable,
                        "etcd: no keep-alive stream could be opened",
                    ))
                }
            },
            () = sleep_until(hedge_at), if timing.ticking && attempts.len() < 3 => {
                attempts.push(open_attempt(client, lease, timing.request_timeout, trips.start()));
                hedge_at += timing.interval;
            }
            ping = pinged.recv() => match ping {
                Some(ping) => waiting.push(ping),
                None => return Opened::Closed,
            },
        }
    }
}

/// Sends one keep-alive (its round trip `trip`) on the stream; `false` when the stream is
/// closed.
async fn send(open: &mut Stream, ping: Option<Ping>, trip: KeepAliveSpan) -> bool {
    let sent = Sent {
        at: Instant::now(),
        ping,
        trip,
    };
    let written = open
        .keeper
        .keep_alive()
        .instrument(sent.trip.span().clone())
        .await;
    if written.is_err() && sent.ping.is_none() {
        sent.heard(SessionNews::Unanswered);
        return false;
    }
    open.pending.push_back(sent);
    written.is_ok()
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

/// Answers every renewal waiting on `stream` (and `extra`) with `answer`, which ends the
/// round trips still pending: `Ok(false)` as the session ended, an error as unanswered.
fn answer_all(stream: Option<Stream>, answer: Result<bool>, extra: Option<Ping>) {
    let news = match &answer {
        Ok(true) => SessionNews::Alive,
        Ok(false) => SessionNews::Ended,
        Err(_) => SessionNews::Unanswered,
    };
    let pending = stream.map(|s| s.pending).unwrap_or_default();
    for ping in pending
        .into_iter()
        .filter_map(|sent| sent.heard(news))
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
