//! The seeded simulation of the core (`conformance_tests::simulation`): a fixed range of
//! seeds in CI, other seeds on demand, and proof that the checker catches broken stores.
//!
//! `DISTLOCK_SIM_SEEDS=1000..5000` runs other seeds; `DISTLOCK_SIM_SEED=1234` replays one
//! seed's plan with its history shown.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use conformance_tests::simulation::{
    check, replay_command, run, run_seed, seeds_from_env, shrink, Check, CoreDefect, Defect, Event,
    How, Key, Mode, Outcome, Plan, Run, Via, What,
};

/// The seeds every CI run plays: about 10 s on the paused clock. With the queue-leave
/// defect put back, 4 of them failed (2231, 6329, 8185 and 9857) with the generator before
/// owners and patterns.
const CI_SEEDS: std::ops::Range<u64> = 0..10_000;

/// Runs at once, a thread each: on the paused clock a run only computes.
const PARALLEL: u64 = 4;

/// Plays `seeds` on [`PARALLEL`] threads; the runs that broke the contract.
fn play(seeds: std::ops::Range<u64>, mut each: impl FnMut(&Run) + Send) -> Vec<Run> {
    let next = AtomicU64::new(seeds.start);
    let (failed, each) = (Mutex::new(Vec::new()), Mutex::new(&mut each));
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::SeqCst);
                if seed >= seeds.end {
                    return;
                }
                let run = run_seed(seed);
                (each.lock().unwrap())(&run);
                if !run.violations.is_empty() {
                    failed.lock().unwrap().push(run);
                }
            });
        }
    });
    failed.into_inner().unwrap()
}

/// What an event counts as in the summary: its kind, with the outcome where there is one.
fn tally(what: &What) -> String {
    match what {
        What::Refused { kind, .. } => format!("Refused({kind:?})"),
        What::Released { result, .. } => format!("Released({result:?})"),
        What::Renewed { result, .. } => format!("Renewed({result:?})"),
        What::Ended { dropped, .. } => format!("Ended(dropped: {dropped})"),
        What::Asked { via, .. } => match via {
            Via::Once { .. } => "Asked(Once)".to_string(),
            Via::Owner(_) => "Asked(Owner)".to_string(),
            via => format!("Asked({via:?})"),
        },
        What::BodyEnded { finished, .. } => format!("BodyEnded(finished: {finished})"),
        What::WorkEnded {
            finished, failed, ..
        } => {
            format!("WorkEnded(finished: {finished}, failed: {failed})")
        }
        What::ScopedReturned { result, .. } => format!("ScopedReturned({result:?})"),
        What::Executed { outcome, .. } => match outcome {
            Outcome::Ran(_) => "Executed(Ran)".to_string(),
            Outcome::Replayed(_) => "Executed(Replayed)".to_string(),
            other => format!("Executed({other:?})"),
        },
        What::SessionEnded { freed, .. } => format!("SessionEnded(freed {})", freed.len()),
        What::Faulted { op, fault, .. } => {
            let fault = format!("{fault:?}");
            format!("Faulted({op:?}, {})", fault.split('(').next().unwrap_or(""))
        }
        other => format!("{other:?}")
            .split([' ', '('])
            .next()
            .unwrap_or("")
            .to_string(),
    }
}

#[test]
fn seeds() {
    let (range, show) = seeds_from_env().unwrap().unwrap_or((CI_SEEDS, false));
    let started = Instant::now();
    let mut seen = BTreeMap::<String, usize>::new();
    let failed = play(range.clone(), |run| {
        // Tokens are unique in a store: a token granted again is an owner's re-entry.
        let mut tokens = HashSet::new();
        for event in run.history.events() {
            *seen.entry(tally(&event.what)).or_default() += 1;
            if let What::Granted { token, .. } = event.what {
                if !tokens.insert(token) {
                    *seen.entry("Granted(re-entry)".to_string()).or_default() += 1;
                }
            }
        }
        if show {
            println!("seed {} ({:?})", run.seed, run.mode);
            for (index, task) in run.plan.tasks.iter().enumerate() {
                println!("t{index}: {task:?}");
            }
            run.plan
                .strikes
                .iter()
                .for_each(|strike| println!("{strike:?}"));
            println!("{}", run.history);
            run.violations
                .iter()
                .for_each(|v| println!("violation: {v}"));
        }
    });
    println!(
        "seeds {range:?}: {} failed in {:?}",
        failed.len(),
        started.elapsed()
    );
    println!("events: {seen:?}");
    let count = failed.len();
    for run in failed {
        eprintln!("seed {} ({:?}) broke the contract:", run.seed, run.mode);
        run.violations.iter().for_each(|v| eprintln!("  {v}"));
        eprintln!("  replay: {}", replay_command(run.seed));
        let small = shrink(run, None);
        eprintln!(
            "  shrunk to {} task(s) and {} fault(s):",
            small.plan.tasks.len(),
            small.plan.strikes.len()
        );
        small.plan.tasks.iter().for_each(|t| eprintln!("    {t:?}"));
        small
            .plan
            .strikes
            .iter()
            .for_each(|s| eprintln!("    {s:?}"));
        small.violations.iter().for_each(|v| eprintln!("    {v}"));
    }
    assert!(count == 0, "{count} seeds broke the contract");
}

#[test]
fn a_seed_plays_one_plan() {
    for seed in [0, 1, 2, 12345] {
        assert_eq!(Plan::from_seed(seed), Plan::from_seed(seed));
    }
    assert_ne!(Plan::from_seed(1), Plan::from_seed(2));
}

/// A failing run shrinks to a smaller plan that still breaks the same guarantee.
#[test]
fn a_failing_run_shrinks() {
    let defect = Defect::GrantWhileHeld;
    let failed = CI_SEEDS
        .map(|seed| run(seed, Mode::Plain, Some(defect)))
        .find(|run| run.plan.tasks.len() > 2 && !run.violations.is_empty())
        .expect("the broken store fails a CI seed with more than two tasks");
    let size = |plan: &Plan| {
        plan.tasks.len()
            + plan.strikes.len()
            + plan.tasks.iter().map(|t| t.steps.len()).sum::<usize>()
    };
    let (before, checks) = (
        size(&failed.plan),
        failed
            .violations
            .iter()
            .map(|v| v.check)
            .collect::<Vec<_>>(),
    );
    let small = shrink(failed, Some(defect));
    assert!(size(&small.plan) < before, "nothing was left out");
    assert!(
        small.violations.iter().any(|v| checks.contains(&v.check)),
        "the shrunk plan no longer fails: {:?}",
        small.violations
    );
}

/// On the paused clock a seed replays its whole history, instants included, not only its
/// plan: what a failing seed prints is what happened.
#[test]
fn a_seed_replays_its_history() {
    for seed in [0, 1, 2231, 12345] {
        let (first, again) = (run_seed(seed), run_seed(seed));
        assert!(
            !first.history.events().is_empty(),
            "seed {seed} recorded nothing"
        );
        assert_eq!(
            first.history.events(),
            again.history.events(),
            "seed {seed} played differently"
        );
    }
}

/// Plays the CI seeds' plans in `mode` on a store broken by `defect` until `check` fails
/// one of them.
fn caught_within_ci_seeds(defect: Defect, mode: Mode, check: Check) {
    for seed in CI_SEEDS {
        let run = run(seed, mode, Some(defect));
        if run.violations.iter().any(|v| v.check == check) {
            println!("{defect:?} caught by {check:?} at seed {seed}");
            return;
        }
    }
    panic!("{defect:?} was not caught by {check:?} within the CI seeds");
}

#[test]
fn a_grant_while_held_is_caught() {
    caught_within_ci_seeds(Defect::GrantWhileHeld, Mode::Plain, Check::Overlap);
}

#[test]
fn a_stale_token_is_caught() {
    caught_within_ci_seeds(Defect::StaleToken, Mode::Plain, Check::TokenOrder);
}

#[test]
fn a_queue_entry_left_behind_is_caught() {
    caught_within_ci_seeds(Defect::LeaveIgnored, Mode::Session, Check::Leftover);
}

// A broken core, per guarantee: each defect of `lock_core::defects` is caught by the check
// of the guarantee it breaks, within the CI seeds.

#[test]
fn a_lease_measured_from_its_reply_is_caught() {
    let defect = Defect::Core(CoreDefect::LeaseFromReply);
    caught_within_ci_seeds(defect, Mode::Plain, Check::LostLate);
}

#[test]
fn a_lease_not_lost_at_its_deadline_is_caught() {
    let defect = Defect::Core(CoreDefect::NoLossAtDeadline);
    caught_within_ci_seeds(defect, Mode::Plain, Check::LostLate);
}

#[test]
fn a_queue_entry_kept_on_cancel_is_caught() {
    let defect = Defect::Core(CoreDefect::QueueEntryKept);
    caught_within_ci_seeds(defect, Mode::Session, Check::Leftover);
}

#[test]
fn a_pause_beyond_the_wait_is_caught() {
    let defect = Defect::Core(CoreDefect::PauseBeyondWait);
    caught_within_ci_seeds(defect, Mode::Plain, Check::Wait);
}

#[test]
fn a_retried_release_said_lost_is_caught() {
    let defect = Defect::Core(CoreDefect::RetriedReleaseLost);
    caught_within_ci_seeds(defect, Mode::Plain, Check::ReleaseVerdict);
}

/// The core reads Tokio's clock (`lock_core::backend::now`), so a paused runtime moves it:
/// a lease granted after an hour of paused time ends a TTL after that paused instant, and
/// a guard of that TTL is lost once the paused clock passes it, with no real time spent.
/// (Before, the core read `std::time::Instant`, and the lease ended an hour in the paused
/// clock's past.)
#[test]
fn the_paused_clock_moves_the_core() {
    use lock_core::backend::{AcquireRequest, LockBackendExt};
    use lock_core::{LockClient, LockKey, MemoryBackend, Renewal};

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let started = Instant::now();
    runtime.block_on(async {
        tokio::time::advance(Duration::from_secs(3600)).await;
        let ttl = Duration::from_secs(30);
        let request = AcquireRequest::new(
            LockKey::new("k").unwrap(),
            ttl,
            Duration::ZERO,
            Renewal::Manual,
        );
        let lease = MemoryBackend::new()
            .acquire_once(&request, Duration::from_secs(5))
            .await
            .unwrap();
        let paused_now = tokio::time::Instant::now();
        assert!(tokio::time::Instant::from_std(lease.valid_until()) > paused_now);
        assert!(tokio::time::Instant::from_std(lease.valid_until()) <= paused_now + ttl);

        let client = LockClient::new(MemoryBackend::new());
        let guard = client
            .lock("manual")
            .ttl(ttl)
            .renewal(Renewal::Manual)
            .await
            .unwrap();
        guard.lost().await;
        assert!(tokio::time::Instant::now() >= paused_now + ttl - Duration::from_secs(1));
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// The defect the simulation found, on its own (seed 1016 of the generator at 6aa3a26,
/// seed 2231 of this one): a bounded wait of 210 ms whose leave of the queue takes 122 ms
/// is dropped 59 ms into that leave. Before the fix (`QueuePlace::leave` took its clean-up
/// before awaiting the request) the queue entry stayed.
#[test]
fn a_wait_dropped_while_leaving_the_queue_leaves_it() {
    use conformance_tests::{Fault, FaultyBackend, Op};
    use lock_core::backend::{DynBackend, LockBackend};
    use lock_core::{LockClient, MemoryBackend};
    use std::sync::Arc;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        for store in [MemoryBackend::fair(), MemoryBackend::fair().with_sessions()] {
            let holder = LockClient::new(store.client());
            let faulty = FaultyBackend::new(Arc::new(store.client()) as DynBackend);
            let waiter = LockClient::new(faulty.clone());
            let guard = holder.lock("k").await.unwrap();
            faulty.inject_times(Op::Queue, Fault::Delay(Duration::from_millis(122)), 2);
            let wait = waiter.lock("k").wait_up_to(Duration::from_millis(210));
            tokio::select! {
                ended = wait => panic!("the wait ended before it was dropped: {ended:?}"),
                () = tokio::time::sleep(Duration::from_millis(269)) => {}
            }
            guard.release().await.unwrap();
            let newcomer = LockClient::new(store.client());
            let got = newcomer.lock("k").wait_up_to(Duration::from_secs(3)).await;
            assert!(
                got.is_ok(),
                "{:?}: the dropped waiter's queue entry stayed ({} queue calls, {} answered)",
                store.capabilities().liveness,
                faulty.calls(Op::Queue),
                faulty.completed(Op::Queue)
            );
        }
    });
}

/// An event of a hand-written history: `at` milliseconds into the run, by task `task`.
fn event(at: u64, task: usize, what: What) -> Event {
    Event {
        at: Duration::from_millis(at),
        task: Some(task),
        what,
    }
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

fn token(value: u64) -> lock_core::FencingToken {
    lock_core::FencingToken::new(value)
}

/// The checks a hand-written history (in plain mode) breaks.
fn broken_checks(events: Vec<Event>) -> Vec<Check> {
    let mut history = vec![Event {
        at: Duration::ZERO,
        task: None,
        what: What::Began { mode: Mode::Plain },
    }];
    history.extend(events);
    check(&history).into_iter().map(|v| v.check).collect()
}

fn asked(at: u64, task: usize, key: Key, how: How, via: Via) -> Event {
    event(
        at,
        task,
        What::Asked {
            guard: 1,
            key,
            how,
            via,
        },
    )
}

fn granted(at: u64, task: usize, key: Key, value: u64, valid_until: u64) -> Event {
    event(
        at,
        task,
        What::Granted {
            guard: 1,
            key,
            token: token(value),
            valid_until: ms(valid_until),
        },
    )
}

fn released(
    at: u64,
    task: usize,
    value: u64,
    result: Result<(), lock_core::ErrorKind>,
) -> Vec<Event> {
    vec![
        event(
            at,
            task,
            What::Ended {
                guard: 1,
                token: token(value),
                dropped: false,
                valid_until: ms(at + 300),
            },
        ),
        event(
            at,
            task,
            What::Released {
                guard: 1,
                token: token(value),
                result,
            },
        ),
    ]
}

/// Two tasks of one owner holding a key under one token is a re-entry, not an overlap; a
/// second token while the first is held breaks the re-entry rule (and mutual exclusion).
#[test]
fn an_owner_is_one_holder_and_keeps_its_token() {
    let k0 = Key::Lock(0);
    let reentry = |second: u64| {
        let mut events = vec![
            asked(0, 0, k0, How::Try, Via::Owner(0)),
            granted(0, 0, k0, 1, 500),
            asked(100, 1, k0, How::Try, Via::Owner(0)),
            granted(100, 1, k0, second, 500),
        ];
        events.extend(released(200, 0, 1, Ok(())));
        events.extend(released(300, 1, second, Ok(())));
        broken_checks(events)
    };
    assert_eq!(reentry(1), vec![]);
    let broken = reentry(2);
    assert!(broken.contains(&Check::Reentry), "{broken:?}");
    assert!(broken.contains(&Check::Overlap), "{broken:?}");
}

/// A `with_lock` body stopped by a loss must make the call say `Lost`.
#[test]
fn a_with_lock_stopped_by_a_loss_says_lost() {
    let k0 = Key::Lock(0);
    let stopped = |result| {
        broken_checks(vec![
            asked(0, 0, k0, How::Try, Via::Scoped),
            granted(0, 0, k0, 1, 300),
            event(
                300,
                0,
                What::BodyEnded {
                    guard: 1,
                    token: token(1),
                    finished: false,
                    valid_until: ms(300),
                },
            ),
            event(300, 0, What::ScopedReturned { guard: 1, result }),
        ])
    };
    assert_eq!(stopped(Err(lock_core::ErrorKind::Lost)), vec![]);
    assert_eq!(stopped(Ok(())), vec![Check::Scoped]);
}

/// Idempotent work that runs after a result was given, and answers that differ, are caught.
#[test]
fn idempotent_work_after_a_recorded_result_is_caught() {
    let i0 = Key::Idempotent(0);
    let run = |task: usize, at: u64, value: u64| {
        vec![
            asked(at, task, i0, How::Try, Via::Idempotent),
            granted(at, task, i0, value, at + 500),
            event(
                at + 100,
                task,
                What::WorkEnded {
                    guard: 1,
                    token: token(value),
                    finished: true,
                    failed: false,
                    valid_until: ms(at + 500),
                },
            ),
            event(
                at + 100,
                task,
                What::Executed {
                    guard: 1,
                    key: i0,
                    outcome: Outcome::Ran(format!("t{task}.1")),
                },
            ),
        ]
    };
    assert_eq!(broken_checks(run(0, 0, 1)), vec![]);
    let mut twice = run(0, 0, 1);
    twice.extend(run(1, 200, 2));
    let broken = broken_checks(twice);
    assert!(
        !broken.is_empty() && broken.iter().all(|c| *c == Check::Idempotent),
        "{broken:?}"
    );
}

/// A once ticket within a dropped ticket's `at_most` is caught.
#[test]
fn a_once_ticket_within_the_window_is_caught() {
    let once = Key::Once(0);
    let via = Via::Once {
        at_least: ms(500),
        at_most: ms(1000),
    };
    let second_at = |at: u64| {
        broken_checks(vec![
            asked(0, 0, once, How::Try, via),
            granted(0, 0, once, 1, 988),
            event(
                100,
                0,
                What::Ended {
                    guard: 1,
                    token: token(1),
                    dropped: true,
                    valid_until: ms(988),
                },
            ),
            asked(at, 1, once, How::Try, via),
            granted(at, 1, once, 2, at + 988),
            event(
                at + 100,
                1,
                What::Ended {
                    guard: 1,
                    token: token(2),
                    dropped: true,
                    valid_until: ms(at + 988),
                },
            ),
        ])
    };
    assert_eq!(second_at(1000), vec![]);
    assert_eq!(second_at(600), vec![Check::Once]);
}

/// A holder whose session the store ended may hear of it after a rival's grant (as
/// documented), and its release says `Lost` before its deadline; a holder whose session
/// was not ended may do neither.
#[test]
fn a_session_ended_by_the_store_is_judged_as_documented() {
    let k0 = Key::Lock(0);
    let rival_after = |ended: bool| {
        let mut events = vec![
            asked(0, 0, k0, How::Try, Via::Client),
            granted(0, 0, k0, 1, 1000),
        ];
        if ended {
            events.push(Event {
                at: ms(100),
                task: None,
                what: What::SessionEnded {
                    key: k0,
                    freed: vec![(k0, token(1))],
                },
            });
        }
        events.push(asked(100, 1, k0, How::Try, Via::Client));
        events.push(granted(100, 1, k0, 2, 1100));
        events.push(event(
            400,
            0,
            What::Lost {
                guard: 1,
                token: token(1),
            },
        ));
        events.extend(released(500, 0, 1, Err(lock_core::ErrorKind::Lost)));
        events.extend(released(600, 1, 2, Ok(())));
        broken_checks(events)
    };
    assert_eq!(rival_after(true), vec![]);
    let broken = rival_after(false);
    for expected in [Check::Overlap, Check::ReleaseVerdict] {
        assert!(broken.contains(&expected), "{broken:?}");
    }
}

/// A current-thread runtime on the paused clock, for the defects below.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// A wait that spends part of its bound in its client's local line has only the rest for
/// the store. Before, the rest was measured by the system clock (`Instant::elapsed`), so
/// on the paused clock the store wait got the whole bound again: 400 ms for a 300 ms wait
/// (the simulation saw 425 of its CI seeds overrun their bounds so).
#[test]
fn a_wait_keeps_its_bound_after_the_local_line() {
    use lock_core::{ErrorKind, LockClient, MemoryBackend};

    paused_runtime().block_on(async {
        let store = MemoryBackend::new();
        let _held = LockClient::new(store.client()).lock("k").await.unwrap();
        let client = LockClient::new(store.client());
        let started = tokio::time::Instant::now();
        let first = client.lock("k").wait_up_to(Duration::from_millis(100));
        let second = client.lock("k").wait_up_to(Duration::from_millis(300));
        let second = async {
            let ended = second.await;
            (ended, started.elapsed())
        };
        let (first, (second, took)) = tokio::join!(first, second);
        assert_eq!(first.unwrap_err().kind(), ErrorKind::TimedOut);
        assert_eq!(second.unwrap_err().kind(), ErrorKind::TimedOut);
        assert_eq!(
            took,
            Duration::from_millis(300),
            "the 300 ms wait took {took:?}"
        );
    });
}

/// A wait whose local line took the whole bound ends there: it does not go to the store
/// for one more attempt, which a slow store would answer a request time-out past the
/// bound.
#[test]
fn a_wait_spent_in_the_local_line_does_not_go_to_the_store() {
    use conformance_tests::{Fault, FaultyBackend, Op};
    use lock_core::backend::DynBackend;
    use lock_core::{ErrorKind, LockClient, MemoryBackend};
    use std::sync::Arc;

    paused_runtime().block_on(async {
        let faulty = FaultyBackend::new(Arc::new(MemoryBackend::new()) as DynBackend);
        let client = LockClient::new(faulty.clone());
        let bound = Duration::from_millis(200);
        let guard = client.lock("k").await.unwrap();
        let started = tokio::time::Instant::now();
        let waiting = tokio::spawn({
            let client = client.clone();
            async move {
                let ended = client.lock("k").wait_up_to(bound).await;
                (ended.map(|_| ()), started.elapsed())
            }
        });
        tokio::time::sleep(bound).await;
        faulty.inject(Op::Acquire, Fault::Delay(Duration::from_millis(150)));
        let acquires = faulty.calls(Op::Acquire);
        guard.release().await.unwrap();
        let (ended, took) = waiting.await.unwrap();
        assert!(took <= bound, "the {bound:?} wait took {took:?}: {ended:?}");
        if let Err(err) = ended {
            assert_eq!(err.kind(), ErrorKind::TimedOut);
            assert_eq!(faulty.calls(Op::Acquire), acquires, "went to the store");
        }
    });
}

/// `wait_up_to(0)` is one try: on a fair store it neither queues nor leaves a queue (three
/// round trips for what one answers), and a held key is refused at once.
#[test]
fn a_zero_wait_is_one_try() {
    use conformance_tests::{FaultyBackend, Op};
    use lock_core::backend::DynBackend;
    use lock_core::{ErrorKind, LockClient, MemoryBackend};
    use std::sync::Arc;

    paused_runtime().block_on(async {
        let store = MemoryBackend::fair();
        let faulty = FaultyBackend::new(Arc::new(store.client()) as DynBackend);
        let client = LockClient::new(faulty.clone());
        let free = client.lock("free").wait_up_to(Duration::ZERO).await;
        free.unwrap().release().await.unwrap();
        let _held = LockClient::new(store.client()).lock("k").await.unwrap();
        let held = client.lock("k").wait_up_to(Duration::ZERO).await;
        assert_eq!(held.unwrap_err().kind(), ErrorKind::HeldByAnother);
        assert_eq!(faulty.calls(Op::Queue), 0, "a zero wait queued");
    });
}

/// What made `cancelled_acquire_leaves_nothing_held` fail one run in three, found by the
/// seeds alone: a cancelled waiter leaves its fair queue from a background clean-up, and
/// a check made as the tasks end can run before that leave lands (or before its retry,
/// after a failed first try). The CI seeds contain such runs: an entry still queued as
/// the tasks ended, the queue empty a moment later with nobody else acting, and no
/// violation. The scenario's check raced its clean-up; it now waits for the store with a
/// deadline, as `drain` does here.
#[test]
fn a_check_at_the_end_races_a_cancelled_waiters_leave() {
    let found = CI_SEEDS.map(run_seed).find_map(|run| {
        let events = run.history.events();
        let queued = events.iter().find_map(|e| match e.what {
            What::QueuedAtEnd { key, .. } => Some((key, e.at)),
            _ => None,
        })?;
        let drained = events.iter().find_map(|e| match e.what {
            What::Drained { key } if key == queued.0 => Some(e.at),
            _ => None,
        })?;
        let cancelled = events
            .iter()
            .any(|e| matches!(e.what, What::Cancelled { key, .. } if key == queued.0));
        (cancelled && run.violations.is_empty()).then_some((run.seed, queued, drained))
    });
    let (seed, (key, ended), drained) =
        found.expect("no CI seed ends with a cancelled waiter's leave still on its way");
    println!(
        "seed {seed}: {key} still queued as the tasks ended at {ended:?}, empty at {drained:?}; replay: {}",
        replay_command(seed)
    );
    assert!(drained > ended);
}

/// A core defect the simulation found, now fixed (seeds 2293, 7093, 7815 of the CI seeds; 4851 and 9108 with a dropped
/// ticket whose `lost()` is still awaited): a once ticket whose job outlives its local
/// deadline is marked lost and released by the core (`HeldLock::mark_lost`), so the key is
/// free up to the drift allowance before `at_most`, and before `at_least` when they are
/// equal: another replica runs the job within the window.
#[test]
fn a_hung_once_job_keeps_its_window() {
    use lock_core::{LockClient, MemoryBackend};
    paused_runtime().block_on(async {
        let store = MemoryBackend::new();
        let (a, b) = (LockClient::new(store.clone()), LockClient::new(store));
        let window = Duration::from_millis(352);
        let start = tokio::time::Instant::now();
        let hung = a
            .once("job")
            .at_least(window)
            .at_most(window)
            .await
            .unwrap()
            .unwrap();
        let second = loop {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if let Some(_second) = b.once("job").await.unwrap() {
                break start.elapsed();
            }
            assert!(start.elapsed() < window * 10, "the window never ended");
        };
        assert!(
            second >= window,
            "another replica got the window at {second:?}, at_least {window:?}"
        );
        drop(hung);
    });
}

/// A core defect the simulation found, now fixed (seeds 1677, 4372, 8209, 8394 of the CI seeds): a reentrant owner's
/// lease is lost and the owner takes the key again under a new lease; the first old guard's
/// release turns the old lease's status from lost to released (`HeldLock::finish`), so the
/// next old guard's release says `Ok` for a lease that was lost.
#[test]
fn every_old_guard_of_a_replaced_lost_lease_says_lost() {
    use lock_core::{ErrorKind, LockClient, MemoryBackend, Renewal};
    paused_runtime().block_on(async {
        let owner = LockClient::new(MemoryBackend::new()).owner();
        let outer = owner
            .lock("k")
            .ttl(Duration::from_millis(50))
            .renewal(Renewal::Manual)
            .await
            .unwrap();
        let inner = owner.lock("k").await.unwrap();
        outer.lost().await;
        let again = owner.lock("k").await.unwrap();
        assert_ne!(again.token(), outer.token());
        assert_eq!(outer.release().await.unwrap_err().kind(), ErrorKind::Lost);
        assert_eq!(
            inner.release().await.map_err(|e| e.kind()),
            Err(ErrorKind::Lost)
        );
        again.release().await.unwrap();
    });
}

/// A core defect the simulation found, now fixed (seeds 24777 and 25238, outside the CI seeds): `renew()` on a lease the
/// engine renews, whose request times out at the deadline it began with, marks the lease
/// lost (`HeldLock::renew_now` judges by its snapshot) although the engine renewed it
/// meanwhile: `lost()` fires and the release says `Lost` with the deadline still ahead.
#[test]
fn a_slow_renew_does_not_lose_a_renewed_lease() {
    use conformance_tests::{Fault, FaultyBackend, Op};
    use lock_core::backend::DynBackend;
    use lock_core::{LockClient, MemoryBackend};
    use std::sync::Arc;
    paused_runtime().block_on(async {
        let faulty = FaultyBackend::new(Arc::new(MemoryBackend::new()) as DynBackend);
        let client = LockClient::new(faulty.clone());
        let guard = client
            .lock("k")
            .ttl(Duration::from_millis(300))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The next renewal (this call's) is slow; the engine's, a TTL/3 in, is answered.
        faulty.inject_times(Op::Renew, Fault::Delay(Duration::from_millis(500)), 1);
        assert!(guard.renew().await.is_err());
        assert!(
            guard.is_held(),
            "lost at {:?} though the lease runs until {:?}",
            tokio::time::Instant::now(),
            guard.lease().valid_until()
        );
        guard.release().await.unwrap();
    });
}
