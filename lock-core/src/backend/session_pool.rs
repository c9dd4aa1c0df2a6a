//! The sessions of one client, pooled: what every session store (etcd leases, ZooKeeper
//! sessions, the memory backend's sessions) needs around its few store calls.
//!
//! A backend implements [`SessionStore`] (open a session, keep it alive once, close it)
//! and holds a [`SessionPool`] of it. The pool opens one session per [`SessionKind`] (one
//! open for any number of concurrent callers), hands it out until the store ends it,
//! keeps it alive on one cadence with each proof measured from its *send* time, reports
//! everything to the session's [`SessionKeeper`] (which fans a loss out to every lease of
//! the session) and closes what it no longer needs.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures_util::stream::{BoxStream, FuturesUnordered, StreamExt};

use crate::backend::request::AcquireRequest;
use crate::backend::session::SessionKeeper;
use crate::backend::sync::lock_unpoisoned as lock;
use crate::values::error::Result;
use crate::values::lease::LeaseId;
use crate::values::options::Renewal;

/// Which session a lease lives by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionKind {
    /// Shared by the client's automatically renewed leases of one (store-rounded) TTL;
    /// the pool keeps it alive.
    Shared(Duration),
    /// A session of one automatically renewed lease, kept alive by the pool: for a store
    /// that names a lease's entry by its session.
    Own(LeaseId),
    /// A session of one lease renewed by hand: only the lease's renewals keep it alive,
    /// so it ends by its TTL once they stop.
    Manual(LeaseId),
}

impl SessionKind {
    /// The session `request` lives by on a store whose leases share sessions: one of its
    /// own when it is renewed by hand (nothing else may keep it alive), else the one of
    /// its store TTL `ttl`.
    pub fn shared(request: &AcquireRequest, ttl: Duration) -> Self {
        match request.renewal() {
            Renewal::Auto => SessionKind::Shared(ttl),
            Renewal::Manual => SessionKind::Manual(request.lease_id()),
        }
    }

    /// The session `request` lives by on a store that gives each lease a session of its
    /// own.
    pub fn own(request: &AcquireRequest) -> Self {
        match request.renewal() {
            Renewal::Auto => SessionKind::Own(request.lease_id()),
            Renewal::Manual => SessionKind::Manual(request.lease_id()),
        }
    }

    /// Whether the pool keeps sessions of this kind alive by itself (all but
    /// [`Manual`](Self::Manual) ones).
    pub fn kept_alive(self) -> bool {
        !matches!(self, SessionKind::Manual(_))
    }
}

/// One keep-alive round trip as operators see it: the `distlock.keep_alive` span, with the
/// store's name (`backend`), the session's id and kind (none for one asked for on
/// demand), and once heard the `outcome` (a [`SessionNews`]).
struct KeepAliveSpan(tracing::Span);

impl KeepAliveSpan {
    fn new(backend: &'static str, kind: Option<SessionKind>, session: u64) -> Self {
        let span = tracing::debug_span!(
            "distlock.keep_alive",
            backend,
            session,
            kind = tracing::field::Empty,
            outcome = tracing::field::Empty
        );
        if let Some(kind) = kind {
            span.record("kind", tracing::field::debug(kind));
        }
        KeepAliveSpan(span)
    }

    fn heard(self, news: SessionNews) {
        self.0.record("outcome", tracing::field::debug(news));
    }
}

/// What one keep-alive, or the store's client between keep-alives, said of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionNews {
    /// The store answered: the session was alive when the keep-alive was sent.
    Alive,
    /// No answer (the connection is down or silent): deadlines stop moving.
    Unanswered,
    /// The store ended the session: every lease of it is gone.
    Ended,
}

/// One session as the pool sees it.
pub trait PooledSession: Send + Sync + 'static {
    /// The session's keeper, created by [`SessionStore::open`] with the send time of the
    /// request that opened the session.
    fn keeper(&self) -> &SessionKeeper;

    /// Whether new acquisitions may still join the session. The default: the store has
    /// not ended it.
    fn usable(&self) -> bool {
        !self.keeper().status().expired
    }
}

/// The store calls behind a [`SessionPool`]: all a session store writes.
#[crate::backend::async_trait]
pub trait SessionStore: Sized + Send + Sync + 'static {
    /// One session of the store.
    type Session: PooledSession;

    /// The store's name, as its backend's [`name`](crate::backend::LockBackend::name):
    /// the `backend` of its keep-alives' `distlock.keep_alive` spans.
    fn name(&self) -> &'static str;

    /// Opens a new session of `kind` that the store ends `ttl` after its last proof of
    /// life. Its keeper counts from the send of the opening request.
    async fn open(&self, kind: SessionKind, ttl: Duration) -> Result<Self::Session>;

    /// Sends one keep-alive for `session` and waits for its answer (bounded: an answer
    /// that does not come is [`SessionNews::Unanswered`]). The pool measures the send
    /// time, and counts the session alive from it.
    async fn keep_alive(&self, session: &Self::Session) -> SessionNews;

    /// How often the pool keeps `session` alive. The default: every third of its TTL.
    fn keep_alive_every(&self, session: &Self::Session) -> Duration {
        session.keeper().status().ttl / 3
    }

    /// News of `session` that its client hears between keep-alives (its connection
    /// dropped, the session ended), as a stream that does not keep the session open.
    /// The default hears none.
    fn news(&self, session: &Self::Session) -> BoxStream<'static, SessionNews> {
        let _ = session;
        futures_util::stream::pending().boxed()
    }

    /// Keeps `session`, of `kind`, alive until the store ends it or the pool drops it.
    /// The default sends a [`keep_alive`](Self::keep_alive) every
    /// [`keep_alive_every`](Self::keep_alive_every), whether or not the last one has been
    /// answered (up to three under way: a slow answer neither holds back the next
    /// keep-alive nor pushes it past the deadline the last one set; each answer proves
    /// the session from its own send), and follows [`news`](Self::news). A store with a
    /// keep-alive protocol of its own overrides it and reports to the keeper itself.
    async fn serve(self: Arc<Self>, kind: SessionKind, session: Weak<Self::Session>) {
        keep_alive_on_cadence(self, kind, session).await;
    }

    /// Ends `session` on the client's side: the keeper reports it expired, which every
    /// lease of it hears. A store that must also let go of a connection overrides it.
    fn end(&self, session: &Self::Session) {
        session.keeper().expired();
    }

    /// Closes `session` on the store, so that its entries go now rather than with its
    /// TTL. The default does nothing (dropping the session is enough).
    async fn close(&self, session: Arc<Self::Session>) {
        let _ = session;
    }
}

/// At most this many keep-alives of one session are under way at once: a slow answer does
/// not hold back the next keep-alive (whose answer proves the session from its own send),
/// and a store that does not answer is not flooded.
const KEEP_ALIVES_UNDER_WAY: usize = 3;

/// One keep-alive and its send time.
type KeepAliveUnderWay = Pin<Box<dyn Future<Output = (Instant, SessionNews)> + Send>>;

/// [`SessionStore::serve`]'s default.
async fn keep_alive_on_cadence<S: SessionStore>(
    store: Arc<S>,
    kind: SessionKind,
    session: Weak<S::Session>,
) {
    if !kind.kept_alive() {
        return;
    }
    let Some((every, mut news)) = session
        .upgrade()
        .map(|current| (store.keep_alive_every(&current), store.news(&current)))
    else {
        return;
    };
    let mut news_open = true;
    let mut under_way: FuturesUnordered<KeepAliveUnderWay> = FuturesUnordered::new();
    let mut next = tokio::time::Instant::now() + every;
    loop {
        let (sent_at, heard) = tokio::select! {
            heard = news.next(), if news_open => match heard {
                Some(heard) => (None, heard),
                None => {
                    news_open = false;
                    continue;
                }
            },
            Some((sent_at, heard)) = under_way.next() => (Some(sent_at), heard),
            () = tokio::time::sleep_until(next), if under_way.len() < KEEP_ALIVES_UNDER_WAY => {
                let Some(current) = session.upgrade() else { return };
                next = tokio::time::Instant::now() + every;
                under_way.push(Box::pin(keep_alive_once(Arc::clone(&store), current, Some(kind))));
                continue;
            }
        };
        let Some(current) = session.upgrade() else {
            return;
        };
        match (sent_at, heard) {
            (Some(sent_at), SessionNews::Alive) => current.keeper().kept_alive(sent_at),
            // Connected again: only a keep-alive proves anything.
            (None, SessionNews::Alive) => {}
            (_, SessionNews::Unanswered) => current.keeper().disconnected(),
            (_, SessionNews::Ended) => {
                store.end(&current);
                return;
            }
        }
    }
}

/// Sends one keep-alive for `session`, in its span, and says when it was sent.
async fn keep_alive_once<S: SessionStore>(
    store: Arc<S>,
    session: Arc<S::Session>,
    kind: Option<SessionKind>,
) -> (Instant, SessionNews) {
    let sent_at = crate::values::clock::now();
    let round_trip = KeepAliveSpan::new(store.name(), kind, session.keeper().session().id());
    let heard =
        tracing::Instrument::instrument(store.keep_alive(&session), round_trip.0.clone()).await;
    round_trip.heard(heard);
    (sent_at, heard)
}

/// The session of one kind: `None` until opened, and while being replaced.
type Slot<S> = Arc<tokio::sync::Mutex<Option<Arc<<S as SessionStore>::Session>>>>;
type Slots<S> = Mutex<HashMap<SessionKind, Slot<S>>>;

/// The sessions of one client of a session store: one session per [`SessionKind`],
/// opened once for concurrent callers, handed out until the store ends it, kept alive on
/// one cadence with each proof measured from its send time, and closed once unneeded.
pub struct SessionPool<S: SessionStore> {
    store: Arc<S>,
    slots: Arc<Slots<S>>,
}

impl<S: SessionStore> SessionPool<S> {
    /// An empty pool over `store`.
    pub fn new(store: S) -> Self {
        SessionPool {
            store: Arc::new(store),
            slots: Arc::default(),
        }
    }

    /// The store the pool opens sessions on.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Sends one keep-alive for `session` now, as the pool's own ones go (in their span,
    /// reported to the session's keeper: an answer proves the session from this send),
    /// and says what it heard: for a lease renewed by hand, whose session nothing else
    /// keeps alive.
    pub async fn keep_alive_now(&self, session: &Arc<S::Session>) -> SessionNews {
        let (sent_at, heard) =
            keep_alive_once(Arc::clone(&self.store), Arc::clone(session), None).await;
        match heard {
            SessionNews::Alive => session.keeper().kept_alive(sent_at),
            SessionNews::Unanswered => session.keeper().disconnected(),
            SessionNews::Ended => self.store.end(session),
        }
        heard
    }

    /// The usable session of `kind`, opening one (of `ttl`) when there is none. Callers
    /// that ask at once share one open; a session the store ended (or one no longer
    /// [`usable`](PooledSession::usable), which is ended now) is never handed out again.
    /// A new session is kept alive ([`SessionStore::serve`]) until it ends or the pool
    /// lets go of it.
    pub async fn session(&self, kind: SessionKind, ttl: Duration) -> Result<Arc<S::Session>> {
        let slot = Arc::clone(lock(&self.slots).entry(kind).or_default());
        let mut current = slot.lock().await;
        if let Some(session) = current.as_ref().filter(|session| session.usable()) {
            return Ok(Arc::clone(session));
        }
        let session = Arc::new(self.store.open(kind, ttl).await?);
        if let Some(replaced) = current.replace(Arc::clone(&session)) {
            self.store.end(&replaced);
        }
        let (store, slots, served) = (
            Arc::clone(&self.store),
            Arc::downgrade(&self.slots),
            Arc::downgrade(&session),
        );
        tokio::spawn(async move {
            store.serve(kind, served.clone()).await;
            forget::<S>(&slots, kind, &served);
        });
        Ok(session)
    }

    /// The pool's sessions with their kinds, except one being opened or replaced right
    /// now.
    pub fn sessions(&self) -> Vec<(SessionKind, Arc<S::Session>)> {
        let slots: Vec<(SessionKind, Slot<S>)> = lock(&self.slots)
            .iter()
            .map(|(kind, slot)| (*kind, Arc::clone(slot)))
            .collect();
        slots
            .into_iter()
            .filter_map(|(kind, slot)| {
                let current = slot.try_lock().ok()?;
                current.as_ref().map(|session| (kind, Arc::clone(session)))
            })
            .collect()
    }

    /// Takes the session of lease `lease_id` (of kind [`Own`](SessionKind::Own) or
    /// [`Manual`](SessionKind::Manual)) out of the pool, waiting for an open under way:
    /// the caller closes it. `None` when the pool has none.
    pub async fn take_own(&self, lease_id: LeaseId) -> Option<Arc<S::Session>> {
        take_session::<S>(self.detach_own(lease_id)).await
    }

    /// Closes the session of lease `lease_id`, if the pool has one, in the background.
    /// It leaves the pool at once: a later acquisition of the lease opens a new one.
    pub fn close_own(&self, lease_id: LeaseId) {
        let detached = self.detach_own(lease_id);
        if detached.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = Arc::clone(&self.store);
        runtime.spawn(async move {
            if let Some(session) = take_session::<S>(detached).await {
                store.close(session).await;
            }
        });
    }

    /// Removes the slots of lease `lease_id`'s own session from the pool.
    fn detach_own(&self, lease_id: LeaseId) -> Vec<Slot<S>> {
        let mut slots = lock(&self.slots);
        [SessionKind::Own(lease_id), SessionKind::Manual(lease_id)]
            .iter()
            .filter_map(|kind| slots.remove(kind))
            .collect()
    }
}

/// The session in detached `slots`, once an open under way there has finished.
async fn take_session<S: SessionStore>(slots: Vec<Slot<S>>) -> Option<Arc<S::Session>> {
    for slot in slots {
        if let Some(session) = slot.lock().await.take() {
            return Some(session);
        }
    }
    None
}

/// Removes `session` from its slot once its keep-alive task ended, if the session is over
/// (a [`Manual`](SessionKind::Manual) one has no task, and stays) and the slot has not
/// moved on to another one (or is being opened, which replaces it anyway).
fn forget<S: SessionStore>(slots: &Weak<Slots<S>>, kind: SessionKind, session: &Weak<S::Session>) {
    let Some(slots) = slots.upgrade() else {
        return;
    };
    let mut slots = lock(&slots);
    let over = slots.get(&kind).is_some_and(|slot| {
        slot.try_lock().is_ok_and(|current| {
            current.as_ref().is_some_and(|current| {
                std::ptr::eq(Arc::as_ptr(current), session.as_ptr()) && !current.usable()
            })
        })
    });
    if over {
        slots.remove(&kind);
    }
}

impl<S: SessionStore> std::fmt::Debug for SessionPool<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionPool")
            .field("sessions", &lock(&self.slots).len())
            .finish_non_exhaustive()
    }
}

impl<S: SessionStore> Drop for SessionPool<S> {
    /// The client is gone: its sessions are closed, so their entries go now, not a TTL
    /// later.
    fn drop(&mut self) {
        let slots: Vec<Slot<S>> = lock(&self.slots).drain().map(|(_, slot)| slot).collect();
        if slots.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = Arc::clone(&self.store);
        runtime.spawn(async move {
            for slot in slots {
                if let Some(session) = slot.lock().await.take() {
                    store.close(session).await;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use super::*;
    use crate::backend::Session;

    /// A store whose opens take a while and whose keep-alives answer after `reply_delay`.
    #[derive(Default)]
    struct Fake {
        opens: AtomicU32,
        closes: AtomicU32,
        ended: AtomicBool,
        reply_delay: Duration,
        /// The first keep-alive is never answered.
        first_hangs: bool,
        sends: Mutex<Vec<Instant>>,
    }

    struct FakeSession(SessionKeeper);

    impl PooledSession for FakeSession {
        fn keeper(&self) -> &SessionKeeper {
            &self.0
        }
    }

    #[crate::backend::async_trait]
    impl SessionStore for Fake {
        type Session = FakeSession;

        fn name(&self) -> &'static str {
            "fake"
        }

        async fn open(&self, _kind: SessionKind, ttl: Duration) -> Result<FakeSession> {
            let sent_at = crate::values::clock::now();
            self.opens.fetch_add(1, Ordering::SeqCst);
            // A round trip, during which other callers ask for the same session.
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(FakeSession(SessionKeeper::new(sent_at, ttl)))
        }

        async fn keep_alive(&self, _session: &FakeSession) -> SessionNews {
            let first = {
                let mut sends = lock(&self.sends);
                sends.push(crate::values::clock::now());
                sends.len() == 1
            };
            if first && self.first_hangs {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(self.reply_delay).await;
            if self.ended.load(Ordering::SeqCst) {
                SessionNews::Ended
            } else {
                SessionNews::Alive
            }
        }

        async fn close(&self, _session: Arc<FakeSession>) {
            self.closes.fetch_add(1, Ordering::SeqCst);
        }
    }

    const LONG: Duration = Duration::from_secs(60);

    /// Waits (at most 10 s) until `session`'s status satisfies `done`.
    async fn until(session: &mut Session, done: impl Fn(&crate::backend::SessionStatus) -> bool) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while !done(&session.status()) {
                assert!(session.changed().await, "the session was dropped");
            }
        })
        .await
        .expect("the session status did not change in time");
    }

    #[tokio::test]
    async fn concurrent_callers_share_one_open() {
        let pool = SessionPool::new(Fake::default());
        let kind = SessionKind::Shared(LONG);
        let opened = futures_util::future::join_all((0..8).map(|_| pool.session(kind, LONG))).await;
        let first = opened[0].as_ref().expect("opened");
        for session in &opened {
            assert!(Arc::ptr_eq(first, session.as_ref().expect("opened")));
        }
        assert_eq!(pool.store().opens.load(Ordering::SeqCst), 1);
        let other = pool.session(SessionKind::Shared(LONG * 2), LONG * 2).await;
        assert!(!Arc::ptr_eq(first, &other.expect("opened")));
        assert_eq!(pool.store().opens.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_session_is_reused_until_it_ends() {
        let pool = SessionPool::new(Fake::default());
        for kind in [
            SessionKind::Shared(LONG),
            SessionKind::Manual(LeaseId::random()),
        ] {
            let first = pool.session(kind, LONG).await.expect("opened");
            tokio::task::yield_now().await;
            let again = pool.session(kind, LONG).await.expect("reused");
            assert!(Arc::ptr_eq(&first, &again), "{kind:?} reused");
            first.keeper().expired();
            let next = pool.session(kind, LONG).await.expect("opened again");
            assert!(
                !Arc::ptr_eq(&first, &next),
                "{kind:?}: an ended session is not reused"
            );
        }
        assert_eq!(pool.store().opens.load(Ordering::SeqCst), 4);
        let own = LeaseId::random();
        let taken = pool
            .session(SessionKind::Manual(own), LONG)
            .await
            .expect("opened");
        let got = pool.take_own(own).await.expect("the pool had it");
        assert!(Arc::ptr_eq(&taken, &got));
        assert!(pool.take_own(own).await.is_none());
    }

    #[tokio::test]
    async fn a_closed_own_session_leaves_the_pool_at_once() {
        let pool = SessionPool::new(Fake::default());
        let lease_id = LeaseId::random();
        let own = SessionKind::Own(lease_id);
        let first = pool.session(own, LONG).await.expect("opened");
        pool.close_own(lease_id);
        let next = pool.session(own, LONG).await.expect("opened again");
        assert!(
            !Arc::ptr_eq(&first, &next),
            "a closing session is not handed out"
        );
        tokio::time::timeout(Duration::from_secs(10), async {
            while pool.store().closes.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the session was closed");
    }

    #[tokio::test]
    async fn keep_alives_count_from_their_send_and_a_loss_reaches_every_lease() {
        let pool = SessionPool::new(Fake {
            reply_delay: Duration::from_millis(150),
            ..Fake::default()
        });
        let ttl = Duration::from_millis(300);
        let kind = SessionKind::Shared(ttl);
        let session = pool.session(kind, ttl).await.expect("opened");
        let opened_at = session.keeper().status().proven_at;
        let (mut one, mut other) = (session.keeper().session(), session.keeper().session());
        until(&mut one, |status| status.proven_at > opened_at).await;
        let answered_at = crate::values::clock::now();
        let sent_at = lock(&pool.store().sends)[0];
        let proven_at = one.status().proven_at;
        assert!(proven_at <= sent_at, "proven from the send, not the answer");
        assert!(answered_at >= proven_at + Duration::from_millis(150));

        pool.store().ended.store(true, Ordering::SeqCst);
        until(&mut one, |status| status.expired).await;
        until(&mut other, |status| status.expired).await;
        drop(session);
        tokio::time::timeout(Duration::from_secs(10), async {
            while !pool.sessions().is_empty() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("an ended session leaves the pool");
    }

    /// A keep-alive that is never answered does not hold back the next one: the session
    /// is proven alive again by a later send (without hedging the cadence waits on the
    /// first for ever and the session runs out).
    #[tokio::test]
    async fn an_unanswered_keep_alive_does_not_hold_back_the_next() {
        let pool = SessionPool::new(Fake {
            first_hangs: true,
            ..Fake::default()
        });
        let ttl = Duration::from_millis(300);
        let session = pool
            .session(SessionKind::Shared(ttl), ttl)
            .await
            .expect("opened");
        let mut watched = session.keeper().session();
        until(&mut watched, |_| lock(&pool.store().sends).len() >= 2).await;
        let first_sent = lock(&pool.store().sends)[0];
        until(&mut watched, |status| status.proven_at > first_sent).await;
        assert!(!watched.status().expired);
    }

    /// The `distlock.keep_alive` spans this thread opened, as their fields were recorded.
    #[derive(Clone, Default)]
    struct KeepAliveSpans(Arc<Mutex<Vec<Fields>>>);

    /// One span's fields, in the order they were recorded.
    #[derive(Clone, Debug, Default)]
    struct Fields(Vec<(String, String)>);

    impl tracing::field::Visit for Fields {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0
                .push((field.name().to_string(), format!("{value:?}")));
        }
    }

    impl tracing::Subscriber for KeepAliveSpans {
        fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
            metadata.name() == "distlock.keep_alive"
        }
        fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            let mut fields = Fields::default();
            span.record(&mut fields);
            let mut spans = lock(&self.0);
            spans.push(fields);
            tracing::span::Id::from_u64(spans.len() as u64)
        }
        fn record(&self, span: &tracing::span::Id, values: &tracing::span::Record<'_>) {
            let index = usize::try_from(span.into_u64()).unwrap_or(0) - 1;
            values.record(&mut lock(&self.0)[index]);
        }
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// Each keep-alive of the pool runs in a `distlock.keep_alive` span naming the store,
    /// the session and its kind, and what the keep-alive heard.
    #[tokio::test]
    async fn a_keep_alive_span_names_the_store_and_the_outcome() {
        let spans = KeepAliveSpans::default();
        // This thread runs every task of the test's runtime, the pool's included.
        let _default = tracing::subscriber::set_default(spans.clone());
        let pool = SessionPool::new(Fake::default());
        let ttl = Duration::from_millis(300);
        let kind = SessionKind::Shared(ttl);
        let session = pool.session(kind, ttl).await.expect("opened");
        let opened_at = session.keeper().status().proven_at;
        let mut watched = session.keeper().session();
        until(&mut watched, |status| status.proven_at > opened_at).await;
        let field = |fields: &Fields, name: &str| {
            let found = fields.0.iter().rev().find(|(field, _)| field == name);
            found.map(|(_, value)| value.clone())
        };
        let first = lock(&spans.0)[0].clone();
        assert_eq!(
            field(&first, "backend").as_deref(),
            Some("\"fake\""),
            "{first:?}"
        );
        let id = watched.id().to_string();
        assert_eq!(field(&first, "session"), Some(id), "{first:?}");
        assert_eq!(
            field(&first, "kind"),
            Some(format!("{kind:?}")),
            "{first:?}"
        );
        assert_eq!(
            field(&first, "outcome").as_deref(),
            Some("Alive"),
            "{first:?}"
        );
    }
}
