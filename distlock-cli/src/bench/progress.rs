//! One progress line on stderr, redrawn in place, only when stderr is a terminal.

use std::io::{IsTerminal as _, Write as _};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

const WIDTH: usize = 24;

/// What is being measured now.
struct Phase {
    store: String,
    workload: &'static str,
    started: Instant,
    /// For counted work: how many steps in all.
    steps: Option<usize>,
    /// For timed work: how long it runs.
    lasts: Option<Duration>,
}

/// The progress line; does nothing when stderr is not a terminal.
#[derive(Clone)]
pub struct Progress {
    enabled: bool,
    phase: Arc<Mutex<Option<Phase>>>,
    done: Arc<AtomicUsize>,
}

impl Progress {
    /// A progress line, drawn every 100 ms by a task of its own if stderr is a terminal.
    pub fn start() -> Self {
        let progress = Progress {
            enabled: std::io::stderr().is_terminal(),
            phase: Arc::default(),
            done: Arc::default(),
        };
        if progress.enabled {
            let drawer = progress.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                // Ends when the bench drops its last handle.
                while Arc::strong_count(&drawer.phase) > 1 {
                    tick.tick().await;
                    drawer.draw();
                }
            });
        }
        progress
    }

    /// Starts measuring `store`.
    pub fn store(&self, store: &str) {
        self.set(|phase| phase.store = store.to_string());
    }

    /// Starts a workload of `steps` steps or lasting `lasts`.
    pub fn phase(&self, workload: &'static str, steps: Option<usize>, lasts: Option<Duration>) {
        self.done.store(0, Ordering::Relaxed);
        self.set(|phase| {
            phase.workload = workload;
            phase.started = Instant::now();
            phase.steps = steps;
            phase.lasts = lasts;
        });
    }

    /// One step of a counted workload is done.
    pub fn advance(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    /// Erases the line.
    pub fn finish(&self) {
        if self.enabled {
            eprint!("\r\x1b[2K");
            let _ = std::io::stderr().flush();
        }
    }

    fn set(&self, change: impl FnOnce(&mut Phase)) {
        let mut phase = self
            .phase
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let phase = phase.get_or_insert_with(|| Phase {
            store: String::new(),
            workload: "",
            started: Instant::now(),
            steps: None,
            lasts: None,
        });
        change(phase);
    }

    fn draw(&self) {
        let phase = self
            .phase
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(phase) = phase.as_ref() else {
            return;
        };
        let fraction = match (phase.steps, phase.lasts) {
            (Some(steps), _) => self.done.load(Ordering::Relaxed) as f64 / steps.max(1) as f64,
            (None, Some(lasts)) => {
                phase.started.elapsed().as_secs_f64() / lasts.as_secs_f64().max(1e-9)
            }
            (None, None) => 0.0,
        }
        .clamp(0.0, 1.0);
        let filled = (fraction * WIDTH as f64).round() as usize;
        eprint!(
            "\r\x1b[2K[{}{}] {:>3.0}%  {}: {}",
            "#".repeat(filled),
            " ".repeat(WIDTH - filled),
            fraction * 100.0,
            phase.store,
            phase.workload
        );
        let _ = std::io::stderr().flush();
    }
}
