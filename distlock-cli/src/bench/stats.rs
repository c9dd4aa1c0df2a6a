//! Latency distributions from every recorded sample (never a mean standing in for one).

use std::time::Duration;

use serde_json::json;

/// Percentiles of a set of recorded latencies (nearest-rank).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Distribution {
    /// How many samples.
    pub count: usize,
    /// The fastest sample.
    pub min: Duration,
    /// 10th percentile.
    pub p10: Duration,
    /// The median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// The slowest sample.
    pub max: Duration,
}

impl Distribution {
    /// The distribution of `samples`; `None` when there are none.
    pub fn of(mut samples: Vec<Duration>) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let at = |percent: usize| {
            // Nearest rank: the smallest sample with at least `percent`% at or below it.
            let rank = (percent * samples.len()).div_ceil(100).max(1);
            samples[rank - 1]
        };
        Some(Distribution {
            count: samples.len(),
            min: samples[0],
            p10: at(10),
            p50: at(50),
            p90: at(90),
            p99: at(99),
            max: samples[samples.len() - 1],
        })
    }

    /// Microseconds, as JSON numbers.
    pub fn to_json(self) -> serde_json::Value {
        let us = |d: Duration| (d.as_secs_f64() * 1e7).round() / 10.0;
        json!({
            "count": self.count,
            "min_us": us(self.min),
            "p10_us": us(self.p10),
            "median_us": us(self.p50),
            "p90_us": us(self.p90),
            "p99_us": us(self.p99),
            "max_us": us(self.max),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_ranks_of_the_samples() {
        let samples: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        let d = Distribution::of(samples).unwrap();
        assert_eq!(d.count, 100);
        assert_eq!(d.min, Duration::from_micros(1));
        assert_eq!(d.p10, Duration::from_micros(10));
        assert_eq!(d.p50, Duration::from_micros(50));
        assert_eq!(d.p90, Duration::from_micros(90));
        assert_eq!(d.p99, Duration::from_micros(99));
        assert_eq!(d.max, Duration::from_micros(100));
        let one = Distribution::of(vec![Duration::from_millis(3)]).unwrap();
        assert_eq!(
            (one.p50, one.p99),
            (Duration::from_millis(3), Duration::from_millis(3))
        );
        assert!(Distribution::of(Vec::new()).is_none());
    }
}
