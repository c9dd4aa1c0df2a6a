//! Shrinking a failing run to a plan small enough to read: tasks, then faults, then the
//! steps of each task are left out one at a time, as long as the run still breaks one of
//! the guarantees the original broke. Each try is a whole run on the paused clock (about a
//! millisecond), so a greedy pass is cheap; it finds a small plan, not the smallest.

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
    leave_out(
        &mut best,
        |plan| plan.tasks.len(),
        |plan, i| {
            plan.tasks.remove(i);
        },
        &still_fails,
    );
    leave_out(
        &mut best,
        |plan| plan.strikes.len(),
        |plan, i| {
            plan.strikes.remove(i);
        },
        &still_fails,
    );
    for task in 0..best.plan.tasks.len() {
        // A task keeps one step: an empty task is the same as one left out.
        leave_out(
            &mut best,
            |plan| match plan.tasks[task].steps.len() {
                1 => 0,
                steps => steps,
            },
            |plan, i| {
                plan.tasks[task].steps.remove(i);
            },
            &still_fails,
        );
    }
    best
}

/// Leaves out the parts of `best`'s plan one at a time (`count` of them, `remove` the one at
/// an index), keeping each leaving-out after which the run still fails.
fn leave_out(
    best: &mut Run,
    count: impl Fn(&Plan) -> usize,
    remove: impl Fn(&mut Plan, usize),
    still_fails: &impl Fn(&Plan) -> Option<Run>,
) {
    let mut index = 0;
    while index < count(&best.plan) {
        let mut plan = best.plan.clone();
        remove(&mut plan, index);
        match still_fails(&plan) {
            Some(run) => *best = run,
            None => index += 1,
        }
    }
}
