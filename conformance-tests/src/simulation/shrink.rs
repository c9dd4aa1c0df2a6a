//! Shrinking a failing run to a plan small enough to read: tasks, then faults, then the
//! steps of each task are left out one at a time, as long as the run still breaks one of
//! the guarantees the original broke. Each try is a whole run on the paused clock (about
//! half a millisecond), so a greedy pass is cheap; it finds a small plan, not the smallest.

use super::{run_plan, Defect, Plan, Run};

/// The smallest failing variant of `failed` that one greedy pass finds (`failed` itself if
/// nothing can go). `defect` is the broken store `failed` ran on, if any.
pub fn shrink(failed: Run, defect: Option<Defect>) -> Run {
    let broken: Vec<_> = failed.violations.iter().map(|v| v.check).collect();
    let (seed, mode) = (failed.seed, failed.mode);
    let still_fails = |plan: &Plan| {
        let run = run_plan(seed, plan.clone(), mode, defect);
        run.violations
            .iter()
            .any(|v| broken.contains(&v.check))
            .then_some(run)
    };
    let mut best = failed;
    let mut index = 0;
    while index < best.plan.tasks.len() {
        let mut plan = best.plan.clone();
        plan.tasks.remove(index);
        match still_fails(&plan) {
            Some(run) => best = run,
            None => index += 1,
        }
    }
    let mut index = 0;
    while index < best.plan.strikes.len() {
        let mut plan = best.plan.clone();
        plan.strikes.remove(index);
        match still_fails(&plan) {
            Some(run) => best = run,
            None => index += 1,
        }
    }
    for task in 0..best.plan.tasks.len() {
        let mut step = 0;
        while step < best.plan.tasks[task].steps.len() && best.plan.tasks[task].steps.len() > 1 {
            let mut plan = best.plan.clone();
            plan.tasks[task].steps.remove(step);
            match still_fails(&plan) {
                Some(run) => best = run,
                None => step += 1,
            }
        }
    }
    best
}
