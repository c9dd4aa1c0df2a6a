//! A lock holder in another process, for the scenarios that kill one without warning: the
//! suite's own test binary, started again with its task in the environment.
//! [`run_suite_with`](crate::run_suite_with) looks for the task before anything else (no
//! server is started), connects by URL through the backend's
//! [`Store`](lock_core::backend::Store) entry, takes the lock, prints `HELD <token>`, and
//! holds it, renewed, until it is killed or the scenario's end of its standard input
//! closes.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use lock_core::backend::Store;
use lock_core::LockClient;
use tokio::sync::mpsc;

use crate::failure::Failure;

/// The URL the holder connects with; its presence makes the test binary a holder.
const URL_VAR: &str = "DISTLOCK_CONFORMANCE_HOLDER_URL";
/// The key the holder locks.
const KEY_VAR: &str = "DISTLOCK_CONFORMANCE_HOLDER_KEY";
/// The TTL of the holder's lock, in milliseconds.
const TTL_VAR: &str = "DISTLOCK_CONFORMANCE_HOLDER_TTL_MS";

/// What a holder process was started to hold.
pub(crate) struct HolderTask {
    url: String,
    key: String,
    ttl: Duration,
}

impl HolderTask {
    /// The task in this process's environment, if it was started as a holder.
    pub(crate) fn from_env() -> Option<Result<HolderTask, String>> {
        let url = std::env::var(URL_VAR).ok()?;
        let task = || {
            let key = std::env::var(KEY_VAR).map_err(|err| format!("{KEY_VAR}: {err}"))?;
            let ttl_ms = std::env::var(TTL_VAR)
                .map_err(|err| err.to_string())
                .and_then(|ms| ms.parse::<u64>().map_err(|err| err.to_string()))
                .map_err(|err| format!("{TTL_VAR}: {err}"))?;
            Ok(HolderTask {
                url,
                key,
                ttl: Duration::from_millis(ttl_ms),
            })
        };
        Some(task())
    }

    /// Holds the lock until the process is killed (or its parent is gone); says why not
    /// on standard output (`FAILED ...`) when it cannot.
    pub(crate) fn run(task: Result<HolderTask, String>, store: Option<Store>) -> ExitCode {
        let held = task.and_then(|task| {
            let store = store.ok_or(
                "the suite was started with run_suite, which cannot connect by URL: \
                 start it with run_suite_with and the backend's STORE",
            )?;
            let runtime = tokio::runtime::Runtime::new().map_err(|err| err.to_string())?;
            runtime.block_on(task.hold(store))
        });
        match held {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                println!("FAILED {err}");
                ExitCode::FAILURE
            }
        }
    }

    async fn hold(self, store: Store) -> Result<(), String> {
        let backend = store
            .connect(&self.url)
            .await
            .map_err(|err| format!("connecting: {err}"))?;
        let guard = LockClient::new(backend)
            .lock(&self.key)
            .ttl(self.ttl)
            .await
            .map_err(|err| format!("locking: {err}"))?;
        let mut out = std::io::stdout();
        writeln!(out, "HELD {}", guard.token().get())
            .and_then(|()| out.flush())
            .map_err(|err| err.to_string())?;
        // Standard input closes when the scenario's process is gone, so a holder whose
        // parent died does not hold for ever; a killed holder never gets here.
        tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()))
            .await
            .map_err(|err| err.to_string())?
            .map_err(|err| err.to_string())?;
        drop(guard);
        Ok(())
    }
}

/// A holder process started by a scenario, killed and reaped when dropped, whatever the
/// scenario's outcome.
pub(crate) struct HolderProcess {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl HolderProcess {
    /// Starts this test binary as a holder of `key` at the store `url` names.
    pub(crate) fn start(url: &str, key: &str, ttl: Duration) -> Result<Self, Failure> {
        let exe = std::env::current_exe()
            .map_err(|err| Failure(format!("cannot find the test binary: {err}")))?;
        let mut child = Command::new(exe)
            .env(URL_VAR, url)
            .env(KEY_VAR, key)
            .env(TTL_VAR, ttl.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|err| Failure(format!("cannot start a holder process: {err}")))?;
        let (sender, lines) = mpsc::unbounded_channel();
        if let Some(stdout) = child.stdout.take() {
            // Ends with the process, when its end of the pipe closes.
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if sender.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(HolderProcess { child, lines })
    }

    /// Waits up to `limit` for the holder to hold its lock; the lock's fencing token.
    pub(crate) async fn held(&mut self, limit: Duration) -> Result<u64, Failure> {
        let line = tokio::time::timeout(limit, self.lines.recv())
            .await
            .map_err(|_| Failure(format!("the holder process held nothing within {limit:?}")))?;
        match line {
            Some(line) => match line.strip_prefix("HELD ") {
                Some(token) => token
                    .parse()
                    .map_err(|err| Failure(format!("the holder process said {line:?}: {err}"))),
                None => Err(Failure(format!("the holder process said {line:?}"))),
            },
            None => Err(Failure(format!(
                "the holder process ended without holding: {:?}",
                self.child.wait()
            ))),
        }
    }

    /// Kills the holder without warning (SIGKILL) and reaps it.
    pub(crate) fn kill(&mut self) -> Result<(), Failure> {
        self.child
            .kill()
            .and_then(|()| self.child.wait().map(drop))
            .map_err(|err| Failure(format!("cannot kill the holder process: {err}")))
    }
}

impl Drop for HolderProcess {
    fn drop(&mut self) {
        // Killing a process already reaped fails harmlessly; waiting again returns its
        // status at once.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
