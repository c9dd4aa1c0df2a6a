//! The results as a table for people and as JSON for scripts.

use std::time::Duration;

use serde_json::json;

use super::stats::Distribution;
use super::workload::{Handovers, Plan, Throughput};

/// One store's results.
#[derive(Clone, Debug)]
pub struct StoreResult {
    /// The store's URL, password hidden.
    pub store: String,
    /// A short name for the table and the chart ([`short_name`]).
    pub name: String,
    /// Uncontended acquire+release latency.
    pub uncontended: Distribution,
    /// Tasks on distinct keys.
    pub distinct_keys: Throughput,
    /// Tasks on one key.
    pub one_key: Handovers,
    /// The semaphore and reader-writer workloads; `None` on a store that refuses them.
    pub shared: Option<super::shared::SharedResult>,
}

impl Throughput {
    /// Cycles per second of wall time.
    pub fn per_second(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl Handovers {
    /// Handovers per second of wall time.
    pub fn per_second(&self) -> f64 {
        self.handovers as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The store's URL without what makes it long: credentials, query, the directory of a
/// SQLite file, all but the first node of a cluster (`redis+redlock://h1:1/0 +2`).
pub fn short_name(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    if scheme == "sqlite" {
        let file = rest.rsplit('/').next().unwrap_or(rest);
        return format!("sqlite://…/{file}");
    }
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let hosts = authority
        .rsplit_once('@')
        .map_or(authority, |(_, hosts)| hosts);
    let mut nodes = hosts.split(',');
    let first = nodes.next().unwrap_or_default();
    let more = nodes.count();
    let path = if path == "/" { "" } else { path };
    if more == 0 {
        format!("{scheme}://{first}{path}")
    } else {
        format!("{scheme}://{first}{path} +{more}")
    }
}

/// A latency for a table cell: `2.1µs`, `183µs`, `1.27ms`, `1.31s`.
pub fn latency(duration: Duration) -> String {
    let us = duration.as_secs_f64() * 1e6;
    if us < 10.0 {
        format!("{us:.1}µs")
    } else if us < 1000.0 {
        format!("{us:.0}µs")
    } else if us < 1e6 {
        format!("{:.2}ms", us / 1e3)
    } else {
        format!("{:.2}s", us / 1e6)
    }
}

/// A rate with thousands separators: `12,345/s`.
pub fn rate(per_second: f64) -> String {
    let whole = per_second.round() as u64;
    let digits = whole.to_string();
    let mut grouped = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    format!("{grouped}/s")
}

/// The table printed at the end of a run.
pub fn table(plan: &Plan, results: &[StoreResult]) -> String {
    let store_width = results
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!(
        "{:<store_width$}  {:^21}  {:^31}  {:^33}\n",
        "",
        "uncontended",
        format!("{} tasks, distinct keys", plan.tasks),
        format!("{} tasks, one key", plan.tasks),
    );
    out.push_str(&format!(
        "{:<store_width$}  {:>10} {:>10}  {:>11} {:>9} {:>9}  {:>13} {:>9} {:>9}\n",
        "store", "median", "p99", "cycles", "median", "p99", "handovers", "median", "p90"
    ));
    for result in results {
        let (distinct, one) = (&result.distinct_keys, &result.one_key);
        let cell = |d: Option<Distribution>, pick: fn(Distribution) -> Duration| {
            d.map_or_else(|| "-".to_string(), |d| latency(pick(d)))
        };
        out.push_str(&format!(
            "{:<store_width$}  {:>10} {:>10}  {:>11} {:>9} {:>9}  {:>13} {:>9} {:>9}\n",
            result.name,
            latency(result.uncontended.p50),
            latency(result.uncontended.p99),
            rate(distinct.per_second()),
            cell(distinct.latency, |d| d.p50),
            cell(distinct.latency, |d| d.p99),
            rate(one.per_second()),
            cell(one.latency, |d| d.p50),
            cell(one.latency, |d| d.p90),
        ));
    }
    out.push_str(&format!(
        "uncontended: {} timed try_lock+release cycles; contended: {:?} per workload, each task \
         with its own client; one key: median and p90 from a release to the next holder's grant; \
         TTL {:?}\n",
        plan.runs, plan.duration, plan.ttl
    ));
    let shared: Vec<_> = results
        .iter()
        .map(|result| {
            (
                result.name.clone(),
                result.uncontended,
                result.shared.clone(),
            )
        })
        .collect();
    out.push_str(&super::shared::table(plan, &shared));
    out
}

/// Everything, as one JSON document (latencies in microseconds).
pub fn to_json(plan: &Plan, results: &[StoreResult]) -> serde_json::Value {
    let stores: Vec<_> = results
        .iter()
        .map(|result| {
            let (distinct, one) = (&result.distinct_keys, &result.one_key);
            json!({
                "store": result.store,
                "uncontended": result.uncontended.to_json(),
                "distinct_keys": {
                    "tasks": plan.tasks,
                    "cycles": distinct.cycles,
                    "seconds": distinct.elapsed.as_secs_f64(),
                    "cycles_per_s": distinct.per_second(),
                    "latency": distinct.latency.map(Distribution::to_json),
                },
                "one_key": {
                    "tasks": plan.tasks,
                    "acquisitions": one.acquisitions,
                    "handovers": one.handovers,
                    "seconds": one.elapsed.as_secs_f64(),
                    "handovers_per_s": one.per_second(),
                    "release_to_next_holder": one.latency.map(Distribution::to_json),
                },
                "shared": super::shared::to_json(plan, result.shared.as_ref()),
            })
        })
        .collect();
    json!({
        "plan": {
            "runs": plan.runs,
            "tasks": plan.tasks,
            "duration_ms": plan.duration.as_millis() as u64,
            "ttl_ms": plan.ttl.as_millis() as u64,
        },
        "stores": stores,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_keep_scheme_host_and_file() {
        assert_eq!(
            short_name("memory://distlock-bench"),
            "memory://distlock-bench"
        );
        assert_eq!(
            short_name("sqlite:///tmp/x/bench.db?synchronous=full"),
            "sqlite://…/bench.db"
        );
        assert_eq!(
            short_name("postgres://u:***@10.0.0.1:5432/app?sslmode=disable"),
            "postgres://10.0.0.1:5432/app"
        );
        assert_eq!(
            short_name("redis://127.0.0.1:6379/0"),
            "redis://127.0.0.1:6379/0"
        );
        assert_eq!(
            short_name("redis+redlock://:***@a:1,b:2,c:3/0"),
            "redis+redlock://a:1/0 +2"
        );
    }

    #[test]
    fn cells_read_well() {
        assert_eq!(latency(Duration::from_nanos(2_140)), "2.1µs");
        assert_eq!(latency(Duration::from_micros(183)), "183µs");
        assert_eq!(latency(Duration::from_micros(1_270)), "1.27ms");
        assert_eq!(rate(1_234_567.4), "1,234,567/s");
        assert_eq!(rate(999.0), "999/s");
        assert_eq!(rate(0.2), "0/s");
    }
}
