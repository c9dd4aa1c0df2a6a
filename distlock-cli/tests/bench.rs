//! `distlock bench` on the stores that need no server: table, JSON and chart, checked for
//! their content.

#![cfg(feature = "sqlite")] // Every test runs on a SQLite file (or the default stores).

mod support;

use support::{bare_distlock, Finished};

const SHORT: [&str; 6] = ["--runs", "40", "--tasks", "3", "--duration", "400ms"];

fn bench(extra: &[&str]) -> Finished {
    let mut command = bare_distlock();
    command.arg("bench").args(SHORT).args(extra);
    let finished = Finished::of(command);
    finished.expect_code(0);
    finished
}

#[test]
fn json_reports_distributions_for_memory_and_sqlite() {
    let run = bench(&["--json"]);
    let value: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON on stdout");
    assert_eq!(value["plan"]["runs"], 40);
    assert_eq!(value["plan"]["tasks"], 3);
    let stores = value["stores"].as_array().expect("stores");
    let names: Vec<&str> = stores.iter().filter_map(|s| s["store"].as_str()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names[0].starts_with("memory://"), "{names:?}");
    assert!(names[1].starts_with("sqlite://"), "{names:?}");
    for store in stores {
        let uncontended = &store["uncontended"];
        assert_eq!(uncontended["count"], 40, "{store}");
        assert_ordered(uncontended);
        let distinct = &store["distinct_keys"];
        assert!(distinct["cycles"].as_u64().unwrap_or(0) > 0, "{store}");
        assert!(
            distinct["cycles_per_s"].as_f64().unwrap_or(0.0) > 0.0,
            "{store}"
        );
        assert_eq!(distinct["latency"]["count"], distinct["cycles"], "{store}");
        assert_ordered(&distinct["latency"]);
        let one = &store["one_key"];
        let handovers = one["handovers"].as_u64().unwrap_or(0);
        assert!(
            handovers > 0,
            "three tasks on one key hand it over: {store}"
        );
        assert!(
            one["acquisitions"].as_u64().unwrap_or(0) >= handovers,
            "{store}"
        );
        assert_eq!(one["release_to_next_holder"]["count"], handovers, "{store}");
        assert_ordered(&one["release_to_next_holder"]);
        let shared = &store["shared"];
        assert_eq!(shared["permit_uncontended"]["count"], 40, "{store}");
        assert_ordered(&shared["permit_uncontended"]);
        let semaphore = &shared["semaphore"]["run"];
        assert_eq!(semaphore["tasks"], 16, "{store}");
        assert!(semaphore["cycles"].as_u64().unwrap_or(0) > 0, "{store}");
        assert_eq!(
            semaphore["latency"]["count"], semaphore["cycles"],
            "{store}"
        );
        let mixed = &shared["readers_writers"];
        assert!(mixed["run"]["cycles"].as_u64().unwrap_or(0) > 0, "{store}");
        // The first task's first cycle is a write.
        assert!(
            mixed["writer_wait"]["count"].as_u64().unwrap_or(0) > 0,
            "{store}"
        );
    }
}

/// A real distribution: min <= p10 <= median <= p90 <= p99 <= max, and not all equal
/// (a mean standing in for every percentile would be).
fn assert_ordered(distribution: &serde_json::Value) {
    let at = |name: &str| {
        distribution[name]
            .as_f64()
            .unwrap_or_else(|| panic!("{name} in {distribution}"))
    };
    let values = [
        "min_us",
        "p10_us",
        "median_us",
        "p90_us",
        "p99_us",
        "max_us",
    ]
    .map(at);
    assert!(
        values.windows(2).all(|pair| pair[0] <= pair[1]),
        "{distribution}"
    );
    assert!(values[0] > 0.0 && values[0] < values[5], "{distribution}");
}

#[test]
fn the_table_and_the_chart_show_every_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let svg_path = dir.path().join("bench.svg");
    let run = bench(&["--svg", svg_path.to_str().expect("utf-8 path")]);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(
        lines[0].contains("uncontended") && lines[0].contains("3 tasks, one key"),
        "{}",
        run.stdout
    );
    for column in ["store", "median", "p99", "cycles", "handovers", "p90"] {
        assert!(lines[1].contains(column), "{}", run.stdout);
    }
    let memory = lines
        .iter()
        .find(|l| l.starts_with("memory://"))
        .expect("a memory row");
    let sqlite = lines
        .iter()
        .find(|l| l.starts_with("sqlite://"))
        .expect("a sqlite row");
    for row in [memory, sqlite] {
        assert!(row.matches("/s").count() >= 2, "two rates: {row}");
        assert!(row.contains("µs") || row.contains("ms"), "latencies: {row}");
    }
    assert!(
        run.stderr.is_empty(),
        "no progress line when stderr is not a terminal: {:?}",
        run.stderr
    );

    let svg = std::fs::read_to_string(&svg_path).expect("the chart was written");
    assert!(
        svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
        "{svg}"
    );
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("memory://distlock-bench") && svg.contains("sqlite://"));
    // Two latency panels with a box and a median per store, two bars per store.
    assert_eq!(svg.matches("class=\"box\"").count(), 4);
    assert_eq!(svg.matches("class=\"median\"").count(), 4);
    assert_eq!(svg.matches("class=\"bar\"").count(), 4);
    assert!(svg.contains("release-to-next-holder") && svg.contains("handovers/s"));
    assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
}

#[test]
fn a_store_that_fails_stops_the_bench_with_exit_69() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut command = bare_distlock();
    command
        .args(["bench", "-s", &format!("sqlite://{}", dir.path().display())])
        .args(SHORT);
    let finished = Finished::of(command);
    finished.expect_code(69);
    assert!(
        finished.stderr.starts_with("distlock: unavailable"),
        "{}",
        finished.stderr
    );
}

#[test]
fn on_a_terminal_a_progress_line_is_drawn_and_erased() {
    // script(1) runs the bench on a pseudo-terminal and copies what it shows.
    let command = format!(
        "{} bench --runs 200 --tasks 2 --duration 600ms",
        env!("CARGO_BIN_EXE_distlock")
    );
    let mut script = std::process::Command::new("script");
    script
        .args(["-qec", &command, "/dev/null"])
        .env_remove("DISTLOCK_STORE");
    let shown = Finished::of(script);
    shown.expect_code(0);
    let output = &shown.stdout;
    assert!(output.contains("\r\x1b[2K["), "a redrawn line: {output:?}");
    // The timed workloads last long enough to be drawn whatever the machine's load.
    assert!(
        output.contains("%  memory://distlock-bench: distinct keys"),
        "{output:?}"
    );
    assert!(
        output.contains("%  sqlite://…/bench.db: one key"),
        "{output:?}"
    );
    // Erased, then the table (its first line starts with the padded store column).
    assert!(
        output.contains("\r\x1b[2K    "),
        "erased before the table: {output:?}"
    );
}
