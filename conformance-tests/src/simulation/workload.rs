//! Seeded workloads: what every task does and which faults strike when, drawn from the
//! seed alone before the run starts, then played against the clients.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_core::memory::MemoryLink;
use lock_core::{
    AcquireOptions, ErrorKind, Execution, FencingToken, LockClient, LockGuard, LockKey, LockOwner,
    LockScope, MemoryBackend, Renewal, Wait,
};

use super::history::{History, Outcome, Via, What};
use super::Mode;
use crate::faults::{Fault, FaultyBackend, Op};

/// The longest a single store request may take before it counts as unanswered; short, so
/// a black-holed request costs little.
pub const REQUEST_TIMEOUT: Duration = Duration::from_millis(250);

/// The TTL of the long leases, which outlive any run.
pub const LONG_TTL: Duration = Duration::from_secs(10);

/// A key of the run. Each pattern has keys of its own: a once hold or an idempotent run's
/// lock is judged by that pattern's rules, which a plain guard on the same key would mix up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// A lock key, for guards (of clients and owners) and `with_lock`.
    Lock(usize),
    /// A once-per-window key.
    Once(usize),
    /// An idempotency key.
    Idempotent(usize),
}

impl Key {
    /// The key's name in the store.
    pub fn name(self) -> String {
        match self {
            Key::Lock(index) => format!("sim/k{index}"),
            Key::Once(index) => format!("sim/once{index}"),
            Key::Idempotent(index) => format!("sim/idem{index}"),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Lock(index) => write!(f, "k{index}"),
            Key::Once(index) => write!(f, "once{index}"),
            Key::Idempotent(index) => write!(f, "idem{index}"),
        }
    }
}

/// How an acquisition may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// `try_lock`: one attempt.
    Try,
    /// `wait_up_to(bound)`.
    UpTo(Duration),
    /// Waits until the key is free.
    Forever,
}

impl How {
    fn wait(self) -> Wait {
        match self {
            How::Try => Wait::No,
            How::UpTo(bound) => Wait::UpTo(bound),
            How::Forever => Wait::Forever,
        }
    }
}

/// How a holder gives the lock back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// `release().await`.
    Release,
    /// Drops the guard (background release).
    Drop,
}

/// One acquisition and, if it succeeds, one hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// The lock key's index.
    pub key: usize,
    /// How it may wait.
    pub how: How,
    /// The lease's TTL.
    pub ttl: Duration,
    /// Drops the acquisition this long after it began, if it has not ended by then.
    pub cancel_after: Option<Duration>,
    /// How long the lock is held once granted.
    pub hold: Duration,
    /// `None`: the renewal engine keeps the lease; `Some(n)`: manual renewal, `n` calls
    /// spread over the hold (too few let the lease run out).
    pub manual_renewals: Option<u32>,
    /// How the hold ends.
    pub end: End,
    /// Takes the same key again at the end of the hold (through the task's owner if it
    /// has one: a re-entry; through the client otherwise: refused while held).
    pub reenter: Option<Reentry>,
}

/// A second acquisition of the key a hold holds, by the same task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reentry {
    /// How it may wait (never for ever without an owner: it would wait for itself).
    pub how: How,
    /// How long it holds once granted.
    pub hold: Duration,
    /// How it ends.
    pub end: End,
    /// The outer hold ends first, so this one is the outermost release.
    pub outlives: bool,
}

/// `with_lock` on a lock key: the body runs `body` long unless stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scoped {
    /// The lock key's index.
    pub key: usize,
    /// How it may wait.
    pub how: How,
    /// The lease's TTL (renewed by the engine).
    pub ttl: Duration,
    /// How long the body runs.
    pub body: Duration,
    /// Drops the call this long after it began, if it has not ended by then.
    pub cancel_after: Option<Duration>,
}

/// `once` on a once key, then a job, then the ticket finished or dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OnceJob {
    /// The once key's index.
    pub key: usize,
    /// The ticket's `at_least`.
    pub at_least: Duration,
    /// The ticket's `at_most`.
    pub at_most: Duration,
    /// How long the job runs (past `at_most`, it runs unprotected).
    pub job: Duration,
    /// Whether the ticket is finished (or dropped, as by a crashed job).
    pub finish: bool,
}

/// `idempotent(...).run(work)` on an idempotency key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdempotentCall {
    /// The idempotency key's index.
    pub key: usize,
    /// `wait_up_to` for a run in progress elsewhere, or `None` (no wait).
    pub wait: Option<Duration>,
    /// The TTL of the lock the work runs under.
    pub ttl: Duration,
    /// How long the work runs.
    pub work: Duration,
    /// Whether the work fails (nothing is recorded then).
    pub fails: bool,
    /// Drops the call this long after it began, if it has not ended by then.
    pub cancel_after: Option<Duration>,
}

/// One step of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Sleeps.
    Pause(Duration),
    /// Acquires and holds.
    Lock(Hold),
    /// Runs a body under `with_lock`.
    Scoped(Scoped),
    /// Runs a once-per-window job.
    Once(OnceJob),
    /// Runs idempotent work.
    Idempotent(IdempotentCall),
}

/// One task: a client (and maybe one of its reentrant owners) and its steps, played in
/// order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    /// The client's index.
    pub client: usize,
    /// The owner (of that client) its guards are taken through, if any.
    pub owner: Option<usize>,
    /// The steps.
    pub steps: Vec<Step>,
}

/// What the harness does to the store at a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blow {
    /// A fault on one client's operation.
    Fault {
        /// The client.
        client: usize,
        /// Which operation.
        op: Op,
        /// The fault.
        fault: Fault,
        /// For how many calls.
        times: u32,
    },
    /// Session mode: the store ends the session holding this key (as etcd revoking a
    /// lease), freeing every key of that session.
    EndSession {
        /// The key.
        key: Key,
    },
    /// Session mode: a client's link is cut, then restored.
    CutLink {
        /// The client.
        client: usize,
        /// For how long.
        lasts: Duration,
    },
    /// The store restarts: unreachable by every client (every operation fails, or goes
    /// unanswered; in session mode every link is cut too), its state kept; then back.
    Restart {
        /// For how long.
        lasts: Duration,
        /// Requests go unanswered rather than fail at once.
        unanswered: bool,
    },
}

/// A blow the harness strikes at a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strike {
    /// When, since the start of the run.
    pub at: Duration,
    /// What.
    pub blow: Blow,
}

/// Everything a run does, drawn from its seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// How many clients (each a `LockClient` over its own `FaultyBackend`).
    pub clients: usize,
    /// How many lock keys.
    pub keys: usize,
    /// How many once keys.
    pub once_keys: usize,
    /// How many idempotency keys.
    pub idempotency_keys: usize,
    /// The reentrant owners: the client each belongs to.
    pub owners: Vec<usize>,
    /// The tasks.
    pub tasks: Vec<Task>,
    /// The blows, in time order.
    pub strikes: Vec<Strike>,
}

fn millis(rng: &mut fastrand::Rng, range: std::ops::RangeInclusive<u64>) -> Duration {
    Duration::from_millis(rng.u64(range))
}

impl Plan {
    /// The plan of seed `seed`: 2-4 clients, 1-3 lock keys, one once key, 1-2 idempotency
    /// keys, up to 2 reentrant owners, 2-6 tasks of 2-5 steps, up to 10 faults in the
    /// first 1.5 seconds, in session mode up to 2 session ends or link cuts, and a store
    /// restart in one plan of four.
    pub fn from_seed(seed: u64) -> Plan {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (clients, keys) = (rng.usize(2..=4), rng.usize(1..=3));
        let (once_keys, idempotency_keys) = (1, rng.usize(1..=2));
        let owners: Vec<usize> = (0..rng.usize(0..=2))
            .map(|_| rng.usize(..clients))
            .collect();
        let mut tasks = Vec::new();
        for _ in 0..rng.usize(2..=6) {
            let owner = (!owners.is_empty() && rng.u8(..3) == 0).then(|| rng.usize(..owners.len()));
            let client = match owner {
                Some(owner) => owners[owner],
                None => rng.usize(..clients),
            };
            let steps = (0..rng.usize(2..=5))
                .map(|_| step(&mut rng, keys, idempotency_keys, owner.is_some()))
                .collect();
            tasks.push(Task {
                client,
                owner,
                steps,
            });
        }
        let mut strikes: Vec<Strike> = (0..rng.usize(0..=10))
            .map(|_| fault(&mut rng, clients))
            .collect();
        if Mode::of_seed(seed) == Mode::Session {
            for _ in 0..rng.usize(0..=2) {
                strikes.push(session_blow(&mut rng, clients, keys, idempotency_keys));
            }
        }
        if rng.u8(..4) == 0 {
            strikes.push(Strike {
                at: millis(&mut rng, 0..=1500),
                blow: Blow::Restart {
                    lasts: millis(&mut rng, 100..=2000),
                    unanswered: rng.bool(),
                },
            });
        }
        strikes.sort_by_key(|strike| strike.at);
        Plan {
            clients,
            keys,
            once_keys,
            idempotency_keys,
            owners,
            tasks,
            strikes,
        }
    }

    /// Every key of the run.
    pub fn all_keys(&self) -> Vec<Key> {
        (0..self.keys)
            .map(Key::Lock)
            .chain((0..self.once_keys).map(Key::Once))
            .chain((0..self.idempotency_keys).map(Key::Idempotent))
            .collect()
    }
}

fn step(rng: &mut fastrand::Rng, keys: usize, idempotency_keys: usize, owned: bool) -> Step {
    match rng.u8(..10) {
        0 | 1 => Step::Pause(millis(rng, 0..=300)),
        6 => Step::Scoped(Scoped {
            key: rng.usize(..keys),
            how: how(rng, true),
            ttl: ttl(rng),
            body: millis(rng, 0..=700),
            cancel_after: (rng.u8(..3) == 0).then(|| millis(rng, 0..=800)),
        }),
        7 => {
            let at_most = millis(rng, 200..=1500);
            Step::Once(OnceJob {
                key: 0,
                at_least: match rng.u8(..8) {
                    0 => at_most,
                    _ => millis(rng, 0..=at_most.as_millis() as u64),
                },
                at_most,
                job: millis(rng, 0..=1200),
                finish: rng.u8(..4) != 0,
            })
        }
        8 | 9 => Step::Idempotent(IdempotentCall {
            key: rng.usize(..idempotency_keys),
            wait: rng.bool().then(|| millis(rng, 0..=600)),
            ttl: millis(rng, 300..=600),
            work: millis(rng, 0..=600),
            fails: rng.u8(..4) == 0,
            cancel_after: (rng.u8(..4) == 0).then(|| millis(rng, 0..=800)),
        }),
        _ => Step::Lock(hold(rng, keys, owned)),
    }
}

/// Short leases expire within the run (losses, takeovers); long ones outlive it, so a
/// lease left behind by a cancelled acquisition or a lost release cannot hide by expiring
/// before the settle time ends.
fn ttl(rng: &mut fastrand::Rng) -> Duration {
    match rng.u8(..4) {
        0 => LONG_TTL,
        _ => millis(rng, 300..=600),
    }
}

fn how(rng: &mut fastrand::Rng, may_wait_forever: bool) -> How {
    match rng.u8(..3) {
        0 => How::Try,
        2 if may_wait_forever => How::Forever,
        _ => How::UpTo(millis(rng, 0..=500)),
    }
}

fn hold(rng: &mut fastrand::Rng, keys: usize, owned: bool) -> Hold {
    let ttl = ttl(rng);
    Hold {
        key: rng.usize(..keys),
        how: how(rng, true),
        ttl,
        cancel_after: rng.bool().then(|| millis(rng, 0..=400)),
        hold: millis(rng, 0..=700),
        manual_renewals: (rng.u8(..3) == 0).then(|| rng.u32(0..=3)),
        end: end(rng),
        // Without an owner the task would wait for itself: never for ever.
        reenter: (rng.u8(..3) == 0).then(|| Reentry {
            how: how(rng, owned),
            hold: millis(rng, 0..=300),
            end: end(rng),
            outlives: rng.bool(),
        }),
    }
}

fn end(rng: &mut fastrand::Rng) -> End {
    if rng.bool() {
        End::Release
    } else {
        End::Drop
    }
}

fn fault(rng: &mut fastrand::Rng, clients: usize) -> Strike {
    let op = [
        Op::Acquire,
        Op::Queue,
        Op::Renew,
        Op::Release,
        Op::Watch,
        Op::Record,
    ][rng.usize(..6)];
    let fault = match rng.u8(..6) {
        0 => Fault::Delay(millis(rng, 1..=300)),
        1 => Fault::Fail(ErrorKind::Unavailable),
        2 => Fault::BlackHole,
        3 => Fault::ApplyThenDropReply,
        4 => Fault::ApplyThenDelayReply(millis(rng, 1..=300)),
        // Within the request timeout: the core's second clean-up release comes a request
        // timeout after the first, and is documented to cover no later landing.
        _ if op == Op::Acquire => Fault::LandLate(millis(rng, 1..=200)),
        _ => Fault::Delay(millis(rng, 1..=300)),
    };
    Strike {
        at: millis(rng, 0..=1500),
        blow: Blow::Fault {
            client: rng.usize(..clients),
            op,
            fault,
            times: rng.u32(1..=3),
        },
    }
}

fn session_blow(
    rng: &mut fastrand::Rng,
    clients: usize,
    keys: usize,
    idempotency_keys: usize,
) -> Strike {
    let at = millis(rng, 0..=2000);
    let blow = match rng.u8(..4) {
        0 => Blow::CutLink {
            client: rng.usize(..clients),
            lasts: millis(rng, 50..=1500),
        },
        1 => Blow::EndSession {
            key: Key::Idempotent(rng.usize(..idempotency_keys)),
        },
        _ => Blow::EndSession {
            key: Key::Lock(rng.usize(..keys)),
        },
    };
    Strike { at, blow }
}

/// One task playing its steps: its client, its owner if any, and the history it records
/// into.
pub struct Player {
    task: usize,
    client: LockClient,
    owner: Option<(usize, LockOwner)>,
    history: History,
    guards: usize,
}

impl Player {
    /// Task number `task` on `client` (through `owner`, number `owner.0`, if any).
    pub fn new(
        task: usize,
        client: LockClient,
        owner: Option<(usize, LockOwner)>,
        history: History,
    ) -> Self {
        Player {
            task,
            client,
            owner,
            history,
            guards: 0,
        }
    }

    /// Plays `steps` in order.
    pub async fn play(mut self, steps: Vec<Step>) {
        for step in steps {
            match step {
                Step::Pause(pause) => tokio::time::sleep(pause).await,
                Step::Lock(hold) => self.hold(&hold).await,
                Step::Scoped(scoped) => self.scoped(&scoped).await,
                Step::Once(job) => self.once(&job).await,
                Step::Idempotent(call) => self.idempotent(&call).await,
            }
        }
    }

    fn record(&self, what: What) {
        self.history.record(Some(self.task), what);
    }

    fn next_guard(&mut self) -> usize {
        self.guards += 1;
        self.guards
    }

    fn since_start(&self, instant: std::time::Instant) -> Duration {
        self.history.since_start(instant)
    }

    /// This client's defaults with the simulation's request timeout and `ttl`.
    fn options(&self, ttl: Duration, how: How) -> AcquireOptions {
        AcquireOptions {
            ttl,
            wait: how.wait(),
            request_timeout: REQUEST_TIMEOUT,
            ..self.client.defaults().clone()
        }
    }

    /// Records [`What::Lost`] when `lost` resolves.
    fn watch_loss(&self, guard: usize, token: FencingToken, lost: impl Future + Send + 'static) {
        let (history, task) = (self.history.clone(), self.task);
        tokio::spawn(async move {
            let _ = lost.await;
            history.record(Some(task), What::Lost { guard, token });
        });
    }

    /// Acquires lock key `key` through the task's owner (or its client), recording the
    /// outcome; the guard and its number if granted.
    async fn acquire(
        &mut self,
        key: usize,
        how: How,
        ttl: Duration,
        renewal: Renewal,
        cancel_after: Option<Duration>,
    ) -> Option<(usize, LockGuard)> {
        let guard = self.next_guard();
        let key = Key::Lock(key);
        let (request, via) = match &self.owner {
            Some((index, owner)) => (owner.lock(key.name()), Via::Owner(*index)),
            None => (self.client.lock(key.name()), Via::Client),
        };
        let request = request.wait(how.wait()).ttl(ttl).renewal(renewal);
        let mut options = request.effective_options();
        options.request_timeout = REQUEST_TIMEOUT;
        let request = request.options(options);
        self.record(What::Asked {
            guard,
            key,
            how,
            via,
        });
        let cancel = cancel_after.unwrap_or(Duration::MAX);
        let outcome = tokio::select! {
            outcome = request => outcome,
            () = tokio::time::sleep(cancel) => {
                self.record(What::Cancelled { guard, key });
                return None;
            }
        };
        match outcome {
            Ok(lock) => {
                let token = lock.token();
                self.record(What::Granted {
                    guard,
                    key,
                    token,
                    valid_until: self.deadline(&lock),
                });
                self.watch_loss(guard, token, lock.lost());
                Some((guard, lock))
            }
            Err(err) => {
                self.record(What::Refused {
                    guard,
                    key,
                    kind: err.kind(),
                });
                None
            }
        }
    }

    async fn hold(&mut self, hold: &Hold) {
        let renewal = match hold.manual_renewals {
            Some(_) => Renewal::Manual,
            None => Renewal::Auto,
        };
        let Some((guard, lock)) = self
            .acquire(hold.key, hold.how, hold.ttl, renewal, hold.cancel_after)
            .await
        else {
            return;
        };
        self.hold_for(guard, hold, &lock).await;
        let Some(reentry) = &hold.reenter else {
            self.end(guard, lock, hold.end).await;
            return;
        };
        let inner = self
            .acquire(hold.key, reentry.how, hold.ttl, Renewal::Auto, None)
            .await;
        let outer = if reentry.outlives {
            self.end(guard, lock, hold.end).await;
            None
        } else {
            Some((guard, lock))
        };
        if let Some((guard, lock)) = inner {
            tokio::time::sleep(reentry.hold).await;
            self.end(guard, lock, reentry.end).await;
        }
        if let Some((guard, lock)) = outer {
            self.end(guard, lock, hold.end).await;
        }
    }

    /// Gives `lock` back as `end` says, recording it.
    async fn end(&self, guard: usize, lock: LockGuard, end: End) {
        let token = lock.token();
        let dropped = end == End::Drop;
        self.record(What::Ended {
            guard,
            token,
            dropped,
            valid_until: self.deadline(&lock),
        });
        // Nothing between the record and the release or drop: an owner's entry count
        // goes down in the same poll.
        if dropped {
            drop(lock);
        } else {
            let result = lock.release().await.map_err(|err| err.kind());
            self.record(What::Released {
                guard,
                token,
                result,
            });
        }
    }

    /// Holds for `hold.hold`, renewing by hand in equal slices if the plan says so.
    async fn hold_for(&self, guard: usize, hold: &Hold, lock: &LockGuard) {
        let renewals = hold.manual_renewals.unwrap_or(0);
        let slice = hold.hold / (renewals + 1);
        for _ in 0..renewals {
            tokio::time::sleep(slice).await;
            let result = lock.renew().await.map_err(|err| err.kind());
            self.record(What::Renewed {
                guard,
                token: lock.token(),
                result,
                valid_until: self.deadline(lock),
            });
        }
        tokio::time::sleep(slice).await;
    }

    fn deadline(&self, lock: &LockGuard) -> Duration {
        self.since_start(lock.lease().valid_until())
    }

    async fn scoped(&mut self, scoped: &Scoped) {
        let guard = self.next_guard();
        let key = Key::Lock(scoped.key);
        let client = self
            .client
            .clone()
            .with_defaults(self.options(scoped.ttl, scoped.how));
        let started = Arc::new(AtomicBool::new(false));
        let body = {
            let (started, length) = (started.clone(), scoped.body);
            let running = self.running(guard, key, Body::Scoped);
            move |scope: LockScope| async move {
                started.store(true, Ordering::SeqCst);
                let mut running = running.start(scope);
                tokio::time::sleep(length).await;
                running.finished = true;
            }
        };
        self.record(What::Asked {
            guard,
            key,
            how: scoped.how,
            via: Via::Scoped,
        });
        let mut call = Box::pin(client.with_lock(key.name(), body));
        let cancel = scoped.cancel_after.unwrap_or(Duration::MAX);
        let result = tokio::select! {
            result = &mut call => Some(result),
            () = tokio::time::sleep(cancel) => None,
        };
        let Some(result) = result else {
            self.record(What::Cancelled { guard, key });
            // Drops a running body, which records that it stopped.
            drop(call);
            return;
        };
        match result {
            Err(err) if !started.load(Ordering::SeqCst) => self.record(What::Refused {
                guard,
                key,
                kind: err.kind(),
            }),
            result => self.record(What::ScopedReturned {
                guard,
                result: result.map_err(|err| err.kind()),
            }),
        }
    }

    async fn once(&mut self, job: &OnceJob) {
        let guard = self.next_guard();
        let key = Key::Once(job.key);
        let client = self
            .client
            .clone()
            .with_defaults(self.options(self.client.defaults().ttl, How::Try));
        self.record(What::Asked {
            guard,
            key,
            how: How::Try,
            via: Via::Once {
                at_least: job.at_least,
                at_most: job.at_most,
            },
        });
        let asked = lock_core::backend::now();
        let request = client
            .once(key.name())
            .at_least(job.at_least)
            .at_most(job.at_most);
        let ticket = match request.await {
            Ok(Some(ticket)) => ticket,
            Ok(None) => return self.record(What::OnceTaken { guard, key }),
            Err(err) => {
                return self.record(What::Refused {
                    guard,
                    key,
                    kind: err.kind(),
                })
            }
        };
        // A ticket does not show its deadline: `at_most` (padded by the core) from the
        // request's send, less the drift allowance. From the ask, with the drift of the
        // unpadded `at_most`, is at most a millisecond early.
        let drift = AcquireOptions {
            ttl: job.at_most,
            ..AcquireOptions::default()
        }
        .drift_allowance();
        let valid_until = self.since_start(asked + job.at_most.saturating_sub(drift));
        let token = ticket.token();
        self.record(What::Granted {
            guard,
            key,
            token,
            valid_until,
        });
        self.watch_loss(guard, token, ticket.lost());
        tokio::time::sleep(job.job).await;
        self.record(What::Ended {
            guard,
            token,
            dropped: !job.finish,
            valid_until,
        });
        if job.finish {
            let result = ticket.finish().await.map_err(|err| err.kind());
            self.record(What::Released {
                guard,
                token,
                result,
            });
        }
    }

    async fn idempotent(&mut self, call: &IdempotentCall) {
        let guard = self.next_guard();
        let key = Key::Idempotent(call.key);
        let client = self
            .client
            .clone()
            .with_defaults(self.options(call.ttl, How::Try));
        let value = format!("t{}.{guard}", self.task);
        let work = {
            let (length, fails) = (call.work, call.fails);
            let running = self.running(guard, key, Body::Work { fails });
            move |scope: LockScope| async move {
                let mut running = running.start(scope);
                tokio::time::sleep(length).await;
                running.finished = true;
                drop(running);
                if fails {
                    Err(())
                } else {
                    Ok(value.into_bytes())
                }
            }
        };
        let mut request = client.idempotent(key.name()).fingerprint(b"sim");
        if let Some(bound) = call.wait {
            request = request.wait_up_to(bound);
        }
        self.record(What::Asked {
            guard,
            key,
            how: call.wait.map_or(How::Try, How::UpTo),
            via: Via::Idempotent,
        });
        let mut run = Box::pin(request.run(work));
        let cancel = call.cancel_after.unwrap_or(Duration::MAX);
        let result = tokio::select! {
            result = &mut run => Some(result),
            () = tokio::time::sleep(cancel) => None,
        };
        let Some(result) = result else {
            self.record(What::Cancelled { guard, key });
            drop(run);
            return;
        };
        let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
        let outcome = match result {
            Ok(Execution::Ran(value)) => Outcome::Ran(text(value)),
            Ok(Execution::Replayed(value)) => Outcome::Replayed(text(value)),
            Ok(Execution::InProgress) => Outcome::InProgress,
            Ok(Execution::Failed(())) => Outcome::Failed,
            Err(err) => Outcome::Error(err.kind()),
        };
        self.record(What::Executed {
            guard,
            key,
            outcome,
        });
    }

    fn running(&self, guard: usize, key: Key, body: Body) -> Running {
        Running {
            history: self.history.clone(),
            task: self.task,
            guard,
            key,
            body,
        }
    }
}

/// What runs under a lock the core holds for the task.
#[derive(Clone, Copy)]
enum Body {
    /// A `with_lock` body.
    Scoped,
    /// An idempotent call's work.
    Work { fails: bool },
}

/// A body about to start: records its start (as the grant) when the core calls it.
struct Running {
    history: History,
    task: usize,
    guard: usize,
    key: Key,
    body: Body,
}

impl Running {
    fn start(self, scope: LockScope) -> RunningBody {
        self.history.record(
            Some(self.task),
            What::Granted {
                guard: self.guard,
                key: self.key,
                token: scope.token(),
                valid_until: self.history.since_start(scope.lease().valid_until()),
            },
        );
        RunningBody {
            running: self,
            scope,
            finished: false,
        }
    }
}

/// A running body: records its end when dropped, whether it finished or was stopped.
struct RunningBody {
    running: Running,
    scope: LockScope,
    finished: bool,
}

impl Drop for RunningBody {
    fn drop(&mut self) {
        let Running {
            history,
            task,
            guard,
            body,
            ..
        } = &self.running;
        let (guard, token, finished) = (*guard, self.scope.token(), self.finished);
        let valid_until = history.since_start(self.scope.lease().valid_until());
        history.record(
            Some(*task),
            match *body {
                Body::Scoped => What::BodyEnded {
                    guard,
                    token,
                    finished,
                    valid_until,
                },
                Body::Work { fails } => What::WorkEnded {
                    guard,
                    token,
                    finished,
                    failed: finished && fails,
                    valid_until,
                },
            },
        );
    }
}

/// The harness's hands on the store: each client's fault wrapper and link, and the store.
pub struct Hands {
    /// Each client's fault wrapper.
    pub backends: Vec<Arc<FaultyBackend>>,
    /// Each client's link (session mode).
    pub links: Vec<Option<MemoryLink>>,
    /// The store, as the harness's own client.
    pub store: MemoryBackend,
    /// Every key of the run.
    pub keys: Vec<Key>,
    /// Where to record.
    pub history: History,
}

/// What the striker does at one instant.
enum Act {
    Blow(Blow),
    Restore(usize),
    Up,
}

/// Strikes each blow at its time (and ends the cuts and restarts when they last out).
pub async fn strike_all(strikes: Vec<Strike>, hands: Hands) {
    let mut acts: Vec<(Duration, Act)> = Vec::new();
    for strike in strikes {
        match strike.blow {
            Blow::CutLink { client, lasts } => acts.push((strike.at + lasts, Act::Restore(client))),
            Blow::Restart { lasts, .. } => acts.push((strike.at + lasts, Act::Up)),
            _ => {}
        }
        acts.push((strike.at, Act::Blow(strike.blow)));
    }
    acts.sort_by_key(|(at, _)| *at);
    let start = tokio::time::Instant::now();
    let mut striker = Striker {
        cuts: vec![0; hands.links.len()],
        outages: 0,
        hands,
    };
    for (at, act) in acts {
        tokio::time::sleep_until(start + at).await;
        striker.act(act).await;
    }
}

struct Striker {
    hands: Hands,
    /// How many cuts (a link's own, a restart's) each link is under.
    cuts: Vec<u32>,
    /// How many restarts are in force.
    outages: u32,
}

impl Striker {
    fn record(&self, what: What) {
        self.hands.history.record(None, what);
    }

    async fn act(&mut self, act: Act) {
        match act {
            // A fault would replace a restart's fault on that operation: none then.
            Act::Blow(Blow::Fault { .. }) if self.outages > 0 => {}
            Act::Blow(Blow::Fault {
                client,
                op,
                fault,
                times,
            }) => {
                self.hands.backends[client].inject_times(op, fault, times);
                self.record(What::Faulted {
                    client,
                    op,
                    fault,
                    times,
                });
            }
            Act::Blow(Blow::EndSession { key }) => self.end_session(key).await,
            Act::Blow(Blow::CutLink { client, .. }) => {
                if self.cut(client) {
                    self.record(What::LinkCut { client });
                }
            }
            Act::Restore(client) => {
                if self.restore(client) {
                    self.record(What::LinkRestored { client });
                }
            }
            Act::Blow(Blow::Restart { unanswered, .. }) => {
                self.outages += 1;
                let fault = match unanswered {
                    true => Fault::BlackHole,
                    false => Fault::Fail(ErrorKind::Unavailable),
                };
                for backend in &self.hands.backends {
                    // A restart fails every operation.
                    Op::ALL.iter().for_each(|op| backend.inject(*op, fault));
                }
                (0..self.cuts.len()).for_each(|client| {
                    self.cut(client);
                });
                self.record(What::StoreDown { unanswered });
            }
            Act::Up => {
                self.outages -= 1;
                if self.outages == 0 {
                    self.hands
                        .backends
                        .iter()
                        .for_each(|backend| backend.heal());
                }
                (0..self.cuts.len()).for_each(|client| {
                    self.restore(client);
                });
                self.record(What::StoreUp);
            }
        }
    }

    /// Cuts `client`'s link unless already cut; whether it has a link.
    fn cut(&mut self, client: usize) -> bool {
        let Some(link) = &self.hands.links[client] else {
            return false;
        };
        if self.cuts[client] == 0 {
            link.cut();
        }
        self.cuts[client] += 1;
        true
    }

    /// Ends one cut of `client`'s link, restoring it after the last; whether it has a
    /// link.
    fn restore(&mut self, client: usize) -> bool {
        let Some(link) = &self.hands.links[client] else {
            return false;
        };
        self.cuts[client] -= 1;
        if self.cuts[client] == 0 {
            link.restore();
        }
        true
    }

    /// Ends the session holding `key`, recording every key (and token) it freed: the keys
    /// whose holder changed across the call, which does not yield, so nothing else moves.
    async fn end_session(&self, key: Key) {
        let Ok(name) = LockKey::new(key.name()) else {
            return;
        };
        let before = self.holders().await;
        if !self.hands.store.end_session_holding(&name) {
            return;
        }
        let after = self.holders().await;
        let freed = before
            .into_iter()
            .filter(|held| !after.contains(held))
            .collect();
        self.record(What::SessionEnded { key, freed });
    }

    /// Every held key of the run, with its holder's token.
    async fn holders(&self) -> Vec<(Key, FencingToken)> {
        let mut held = Vec::new();
        for key in &self.hands.keys {
            let Ok(name) = LockKey::new(key.name()) else {
                continue;
            };
            if let Ok(Some(info)) =
                lock_core::backend::LockBackend::inspect(&self.hands.store, &name).await
            {
                held.push((*key, info.token));
            }
        }
        held
    }
}
