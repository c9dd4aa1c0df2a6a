//! The README's capability table, one row per backend, generated from what each backend
//! declares and checked against the README by every backend's suite run, so the table
//! people choose a store by can never drift from the code.

use std::time::Duration;

use lock_core::{Capabilities, ErrorKind, Liveness};

use crate::harness::{Ctx, Failure};

/// The table's header, as it stands in the README.
pub const HEADER: &str = "| store | fair queue | release notification | durable tokens | TTL | leases live by | idempotency records | once per window | semaphores, rw locks | lock sets | holder label |";

/// What a store does with a holder label, found by trying one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HolderLabel {
    /// `inspect` returns it.
    Kept,
    /// An acquisition with one is refused up front.
    Refused,
    /// Accepted and lost: a defect, reported as such.
    Dropped,
}

/// The README row of backend `name`.
pub fn row(name: &str, caps: &Capabilities, label: HolderLabel) -> String {
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let liveness = match caps.liveness {
        Liveness::PerLease => "renewal per lease",
        Liveness::Batched => "batched renewal",
        Liveness::Session => "store session",
    };
    let label = match label {
        HolderLabel::Kept => "kept",
        HolderLabel::Refused => "refused",
        HolderLabel::Dropped => "DROPPED",
    };
    format!(
        "| {name} | {} | {} | {} | {} to {} | {liveness} | {} | {} | {} | {} | {label} |",
        yes_no(caps.fair_ordering),
        yes_no(caps.native_notification),
        yes_no(caps.durable_fencing),
        human(caps.min_ttl),
        human(caps.max_ttl),
        yes_no(caps.records),
        yes_no(caps.once_holds()),
        yes_no(caps.shared_holds),
        if caps.atomic_sets {
            "atomic"
        } else {
            "in order"
        },
    )
}

/// `1 ms`, `2 s`, `40 s`, `1 day`: the largest unit that divides the duration.
fn human(duration: Duration) -> String {
    let ms = duration.as_millis();
    for (unit_ms, unit) in [
        (86_400_000, "day"),
        (3_600_000, "h"),
        (60_000, "min"),
        (1000, "s"),
    ] {
        if ms >= unit_ms && ms.is_multiple_of(unit_ms) {
            let n = ms / unit_ms;
            return match unit {
                "day" if n > 1 => format!("{n} days"),
                _ => format!("{n} {unit}"),
            };
        }
    }
    format!("{ms} ms")
}

/// Tries a holder label on the backend of `ctx`.
pub async fn probe_holder_label(ctx: &Ctx) -> Result<HolderLabel, Failure> {
    let key = ctx.key("holder-label");
    let client = ctx.client().await?;
    let label = "capability-probe";
    let guard = match client.lock(&key).holder_label(label).await {
        Ok(guard) => guard,
        Err(err) if matches!(err.kind(), ErrorKind::InvalidInput | ErrorKind::Unsupported) => {
            return Ok(HolderLabel::Refused)
        }
        Err(err) => return Err(err.into()),
    };
    let info = client.inspect(&key).await?;
    guard.release().await?;
    Ok(match info.and_then(|info| info.holder) {
        Some(kept) if kept == label => HolderLabel::Kept,
        _ => HolderLabel::Dropped,
    })
}

/// Checks that the README carries backend `name`'s row as generated now.
pub async fn check_readme_row(ctx: &Ctx, name: &str) -> Result<(), Failure> {
    let readme = include_str!("../../README.md");
    let label = probe_holder_label(ctx).await?;
    let expected = row(name, ctx.capabilities(), label);
    if label == HolderLabel::Dropped {
        return Err(Failure(format!(
            "{name} accepts a holder label and drops it: store it or refuse it ({expected})"
        )));
    }
    if !readme.contains(HEADER) {
        return Err(Failure(format!(
            "README.md lacks the capability table header:\n{HEADER}"
        )));
    }
    if !readme.lines().any(|line| line == expected) {
        return Err(Failure(format!(
            "README.md's capability table differs from what {name} declares; its row is:\n{expected}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(human(Duration::from_millis(1)), "1 ms");
        assert_eq!(human(Duration::from_millis(1500)), "1500 ms");
        assert_eq!(human(Duration::from_secs(40)), "40 s");
        assert_eq!(human(Duration::from_secs(120)), "2 min");
        assert_eq!(human(Duration::from_secs(86_400)), "1 day");
        assert_eq!(human(Duration::from_secs(2 * 86_400)), "2 days");
    }
}
