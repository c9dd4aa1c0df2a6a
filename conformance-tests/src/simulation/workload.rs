//! Seeded workloads: what every task does and which faults strike when, drawn from the
//! seed alone before the run starts, then played against the clients.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{ErrorKind, LockClient, LockGuard, Renewal, Wait};

use super::history::{History, What};
use crate::faults::{Fault, FaultyBackend, Op};

/// The longest a single store request may take before it counts as unanswered; short, so
/// a black-holed request costs little.
pub const REQUEST_TIMEOUT: Duration = Duration::from_millis(250);

/// The TTL of the long leases, which outlive any run.
pub const LONG_TTL: Duration = Duration::from_secs(10);

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
    /// The key's index.
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
}

/// One step of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Sleeps.
    Pause(Duration),
    /// Acquires and holds.
    Lock(Hold),
}

/// One task: a client and its steps, played in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    /// The client's index.
    pub client: usize,
    /// The steps.
    pub steps: Vec<Step>,
}

/// A fault the harness puts in force at a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strike {
    /// When, since the start of the run.
    pub at: Duration,
    /// On which client.
    pub client: usize,
    /// Which operation.
    pub op: Op,
    /// The fault.
    pub fault: Fault,
    /// For how many calls.
    pub times: u32,
}

/// Everything a run does, drawn from its seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// How many clients (each a `LockClient` over its own `FaultyBackend`).
    pub clients: usize,
    /// How many keys.
    pub keys: usize,
    /// The tasks.
    pub tasks: Vec<Task>,
    /// The faults, in time order.
    pub strikes: Vec<Strike>,
}

fn millis(rng: &mut fastrand::Rng, range: std::ops::RangeInclusive<u64>) -> Duration {
    Duration::from_millis(rng.u64(range))
}

impl Plan {
    /// The plan of seed `seed`: 2-4 clients, 1-3 keys, 2-6 tasks of 2-5 steps, up to 10
    /// faults in the first 1.5 seconds.
    pub fn from_seed(seed: u64) -> Plan {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (clients, keys) = (rng.usize(2..=4), rng.usize(1..=3));
        let tasks = (0..rng.usize(2..=6))
            .map(|_| Task {
                client: rng.usize(..clients),
                steps: (0..rng.usize(2..=5))
                    .map(|_| step(&mut rng, keys))
                    .collect(),
            })
            .collect();
        let mut strikes: Vec<Strike> = (0..rng.usize(0..=10))
            .map(|_| strike(&mut rng, clients))
            .collect();
        strikes.sort_by_key(|strike| strike.at);
        Plan {
            clients,
            keys,
            tasks,
            strikes,
        }
    }
}

fn step(rng: &mut fastrand::Rng, keys: usize) -> Step {
    if rng.u8(..4) == 0 {
        return Step::Pause(millis(rng, 0..=300));
    }
    // Short leases expire within the run (losses, takeovers); long ones outlive it, so a
    // lease left behind by a cancelled acquisition or a lost release cannot hide by
    // expiring before the settle time ends.
    let ttl = match rng.u8(..4) {
        0 => LONG_TTL,
        _ => millis(rng, 300..=600),
    };
    Step::Lock(Hold {
        key: rng.usize(..keys),
        how: match rng.u8(..3) {
            0 => How::Try,
            1 => How::UpTo(millis(rng, 0..=500)),
            _ => How::Forever,
        },
        ttl,
        cancel_after: rng.bool().then(|| millis(rng, 0..=400)),
        hold: millis(rng, 0..=700),
        manual_renewals: (rng.u8(..3) == 0).then(|| rng.u32(0..=3)),
        end: if rng.bool() { End::Release } else { End::Drop },
    })
}

fn strike(rng: &mut fastrand::Rng, clients: usize) -> Strike {
    let op = [Op::Acquire, Op::Queue, Op::Renew, Op::Release, Op::Watch][rng.usize(..5)];
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
        client: rng.usize(..clients),
        op,
        fault,
        times: rng.u32(1..=3),
    }
}

/// Plays `task` (number `index`) on `client`, recording into `history`.
pub async fn play(index: usize, task: Task, client: LockClient, history: History) {
    for step in task.steps {
        match step {
            Step::Pause(pause) => tokio::time::sleep(pause).await,
            Step::Lock(hold) => play_hold(index, &hold, &client, &history).await,
        }
    }
}

async fn play_hold(task: usize, hold: &Hold, client: &LockClient, history: &History) {
    let key = super::key_name(hold.key);
    let request = match hold.how {
        How::Try => client.try_lock(&key),
        How::UpTo(bound) => client.lock(&key).wait_up_to(bound),
        How::Forever => client.lock(&key).wait(Wait::Forever),
    };
    let renewal = match hold.manual_renewals {
        Some(_) => Renewal::Manual,
        None => Renewal::Auto,
    };
    let request = request.ttl(hold.ttl).renewal(renewal);
    let mut options = request.effective_options();
    options.request_timeout = REQUEST_TIMEOUT;
    let request = request.options(options);
    history.record(
        Some(task),
        What::Asked {
            key: hold.key,
            how: hold.how,
        },
    );
    let cancel = hold.cancel_after.unwrap_or(Duration::MAX);
    let outcome = tokio::select! {
        outcome = request => outcome,
        () = tokio::time::sleep(cancel) => {
            history.record(Some(task), What::Cancelled { key: hold.key });
            return;
        }
    };
    let guard = match outcome {
        Ok(guard) => guard,
        Err(err) => {
            history.record(
                Some(task),
                What::Refused {
                    key: hold.key,
                    kind: err.kind(),
                },
            );
            return;
        }
    };
    let token = guard.token();
    history.record(
        Some(task),
        What::Granted {
            key: hold.key,
            token,
            valid_until: deadline(&guard, history),
        },
    );
    let lost = guard.lost();
    let watcher = history.clone();
    tokio::spawn(async move {
        lost.await;
        watcher.record(Some(task), What::Lost { token });
    });
    hold_for(task, hold, &guard, history).await;
    let valid_until = deadline(&guard, history);
    let dropped = hold.end == End::Drop;
    history.record(
        Some(task),
        What::Ended {
            token,
            dropped,
            valid_until,
        },
    );
    if !dropped {
        let result = guard.release().await.map_err(|err| err.kind());
        history.record(Some(task), What::Released { token, result });
    }
}

/// Holds for `hold.hold`, renewing by hand in equal slices if the plan says so.
async fn hold_for(task: usize, hold: &Hold, guard: &LockGuard, history: &History) {
    let renewals = hold.manual_renewals.unwrap_or(0);
    let slice = hold.hold / (renewals + 1);
    for _ in 0..renewals {
        tokio::time::sleep(slice).await;
        let result = guard.renew().await.map_err(|err| err.kind());
        let valid_until = deadline(guard, history);
        history.record(
            Some(task),
            What::Renewed {
                token: guard.token(),
                result,
                valid_until,
            },
        );
    }
    tokio::time::sleep(slice).await;
}

fn deadline(guard: &LockGuard, history: &History) -> Duration {
    history.since_start(guard.lease().valid_until())
}

/// Puts each strike in force at its time.
pub async fn strike_all(strikes: Vec<Strike>, backends: Vec<Arc<FaultyBackend>>, history: History) {
    let start = tokio::time::Instant::now();
    for strike in strikes {
        tokio::time::sleep_until(start + strike.at).await;
        backends[strike.client].inject_times(strike.op, strike.fault, strike.times);
        history.record(
            None,
            What::Faulted {
                client: strike.client,
                op: strike.op,
                fault: strike.fault,
                times: strike.times,
            },
        );
    }
}
