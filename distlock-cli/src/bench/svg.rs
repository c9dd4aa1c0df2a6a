//! A hand-written SVG chart of a bench run: the two latency distributions per store (box
//! from p10 to p90, median mark, whisker from min to p99) on one log axis, and the two
//! throughputs per store as bars on a log axis.

use std::fmt::Write as _;
use std::time::Duration;

use super::report::{latency, rate, StoreResult};
use super::stats::Distribution;
use super::workload::Plan;

const WIDTH: f64 = 1000.0;
const LABEL_X: f64 = 16.0;
const PLOT_LEFT: f64 = 300.0;
const PLOT_RIGHT: f64 = WIDTH - 180.0;
const ROW: f64 = 24.0;
const COLORS: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

/// The chart, as a complete SVG document.
pub fn chart(plan: &Plan, results: &[StoreResult]) -> String {
    let mut body = String::new();
    let mut y = 40.0;
    let _ = write!(
        body,
        r##"<text x="{LABEL_X}" y="24" font-size="16" font-weight="bold">distlock bench: {} stores, {} tasks, {:?} per contended workload</text>"##,
        results.len(),
        plan.tasks,
        plan.duration
    );
    let latencies: Vec<f64> = results
        .iter()
        .flat_map(|r| {
            let mut values = vec![r.uncontended.min, r.uncontended.p99];
            if let Some(d) = r.one_key.latency {
                values.extend([d.min, d.p99]);
            }
            values
        })
        .map(|d| d.as_secs_f64() * 1e6)
        .collect();
    let axis = LogAxis::covering(&latencies);
    y = latency_panel(
        &mut body,
        y,
        "uncontended acquire + release latency",
        &axis,
        results
            .iter()
            .map(|r| (r.name.as_str(), Some(r.uncontended))),
    );
    y = latency_panel(
        &mut body,
        y + 20.0,
        &format!(
            "one key, {} tasks: release-to-next-holder latency",
            plan.tasks
        ),
        &axis,
        results.iter().map(|r| (r.name.as_str(), r.one_key.latency)),
    );
    y = throughput_panel(&mut body, y + 20.0, plan, results);
    let height = y + 30.0;
    let _ = write!(
        body,
        r##"<text x="{LABEL_X}" y="{:.0}" font-size="11" fill="#555">box: p10 to p90, bar in the box: median, whisker: min to p99; latency axis in µs, log scale</text>"##,
        height - 12.0
    );
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH:.0}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {WIDTH:.0} {height:.0}\" font-family=\"sans-serif\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{body}\n</svg>\n"
    )
}

/// A base-10 log axis over whole decades, from `PLOT_LEFT` to `PLOT_RIGHT`.
struct LogAxis {
    low: i32,
    high: i32,
}

impl LogAxis {
    fn covering(values: &[f64]) -> Self {
        let positive = values.iter().copied().filter(|v| *v > 0.0);
        let low = positive.clone().fold(f64::INFINITY, f64::min);
        let high = positive.fold(0.0, f64::max);
        if !low.is_finite() {
            return LogAxis { low: 0, high: 1 };
        }
        let low = low.log10().floor() as i32;
        let high = (high.log10().ceil() as i32).max(low + 1);
        LogAxis { low, high }
    }

    fn x(&self, value: f64) -> f64 {
        let fraction =
            (value.max(1e-9).log10() - f64::from(self.low)) / f64::from(self.high - self.low);
        PLOT_LEFT + fraction.clamp(0.0, 1.0) * (PLOT_RIGHT - PLOT_LEFT)
    }

    /// Grid lines and decade labels between `top` and `bottom`.
    fn draw(&self, out: &mut String, top: f64, bottom: f64, label: impl Fn(f64) -> String) {
        for decade in self.low..=self.high {
            let value = 10f64.powi(decade);
            let x = self.x(value);
            let _ = write!(
                out,
                r##"<line x1="{x:.1}" y1="{top:.1}" x2="{x:.1}" y2="{bottom:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#555">{}</text>"##,
                bottom + 12.0,
                label(value)
            );
        }
    }
}

fn latency_panel<'a>(
    out: &mut String,
    top: f64,
    title: &str,
    axis: &LogAxis,
    rows: impl Iterator<Item = (&'a str, Option<Distribution>)>,
) -> f64 {
    let rows: Vec<_> = rows.collect();
    let _ = write!(
        out,
        r##"<text x="{LABEL_X}" y="{:.1}" font-size="13" font-weight="bold">{}</text>"##,
        top + 14.0,
        escape(title)
    );
    let first = top + 24.0;
    let bottom = first + ROW * rows.len() as f64;
    axis.draw(out, first, bottom, decade_latency);
    for (index, (store, distribution)) in rows.iter().enumerate() {
        let y = first + ROW * index as f64;
        let middle = y + ROW / 2.0;
        let color = COLORS[index % COLORS.len()];
        store_label(out, store, middle);
        let Some(d) = distribution else {
            let _ = write!(
                out,
                r##"<text x="{PLOT_LEFT}" y="{:.1}" font-size="11" fill="#555">no samples</text>"##,
                middle + 4.0
            );
            continue;
        };
        let x = |d: Duration| axis.x(d.as_secs_f64() * 1e6);
        let _ = write!(
            out,
            r##"<line class="whisker" x1="{:.1}" y1="{middle:.1}" x2="{:.1}" y2="{middle:.1}" stroke="{color}" stroke-width="1.5"/>"##,
            x(d.min),
            x(d.p99)
        );
        let _ = write!(
            out,
            r##"<rect class="box" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}" fill-opacity="0.35" stroke="{color}"/>"##,
            x(d.p10),
            y + 5.0,
            (x(d.p90) - x(d.p10)).max(1.0),
            ROW - 10.0
        );
        let _ = write!(
            out,
            r##"<line class="median" x1="{m:.1}" y1="{:.1}" x2="{m:.1}" y2="{:.1}" stroke="{color}" stroke-width="3"/>"##,
            y + 3.0,
            y + ROW - 3.0,
            m = x(d.p50)
        );
        let _ = write!(
            out,
            r##"<text x="{:.1}" y="{:.1}" font-size="11">median {} · p99 {}</text>"##,
            PLOT_RIGHT + 6.0,
            middle + 4.0,
            latency(d.p50),
            latency(d.p99)
        );
    }
    bottom + 16.0
}

fn throughput_panel(out: &mut String, top: f64, plan: &Plan, results: &[StoreResult]) -> f64 {
    let _ = write!(
        out,
        r##"<text x="{LABEL_X}" y="{:.1}" font-size="13" font-weight="bold">throughput, {} tasks: cycles/s on distinct keys (solid), handovers/s on one key (light)</text>"##,
        top + 14.0,
        plan.tasks
    );
    let rates: Vec<f64> = results
        .iter()
        .flat_map(|r| [r.distinct_keys.per_second(), r.one_key.per_second()])
        .collect();
    let mut axis = LogAxis::covering(&rates);
    axis.low = axis.low.min(0);
    let first = top + 24.0;
    let bottom = first + 2.0 * ROW * results.len() as f64;
    axis.draw(out, first, bottom, rate);
    for (index, result) in results.iter().enumerate() {
        let y = first + 2.0 * ROW * index as f64;
        let color = COLORS[index % COLORS.len()];
        store_label(out, &result.name, y + ROW);
        for (row, (value, opacity, what)) in [
            (result.distinct_keys.per_second(), 0.9, "distinct keys"),
            (result.one_key.per_second(), 0.4, "one key"),
        ]
        .into_iter()
        .enumerate()
        {
            let bar_y = y + ROW * row as f64 + 3.0;
            let width = (axis.x(value.max(1.0)) - PLOT_LEFT).max(1.0);
            let _ = write!(
                out,
                r##"<rect class="bar" x="{PLOT_LEFT}" y="{bar_y:.1}" width="{width:.1}" height="{:.1}" fill="{color}" fill-opacity="{opacity}"><title>{what}</title></rect><text x="{:.1}" y="{:.1}" font-size="11">{} {what}</text>"##,
                ROW - 6.0,
                PLOT_RIGHT + 6.0,
                bar_y + ROW / 2.0 + 1.0,
                rate(value),
            );
        }
    }
    bottom + 16.0
}

/// A decade of microseconds: `1µs`, `100µs`, `10ms`, `1s`.
fn decade_latency(us: f64) -> String {
    if us < 1e3 {
        format!("{us:.0}µs")
    } else if us < 1e6 {
        format!("{:.0}ms", us / 1e3)
    } else {
        format!("{:.0}s", us / 1e6)
    }
}

fn store_label(out: &mut String, store: &str, middle: f64) {
    let shown: String = if store.chars().count() > 44 {
        let head: String = store.chars().take(43).collect();
        format!("{head}…")
    } else {
        store.to_string()
    };
    let _ = write!(
        out,
        r##"<text x="{LABEL_X}" y="{:.1}" font-size="12"><title>{}</title>{}</text>"##,
        middle + 4.0,
        escape(store),
        escape(&shown)
    );
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
