//! The command line, as clap's derive API reads it.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::duration::parse_duration;

const EXIT_CODES: &str = "\
Exit codes:
  0    success (run: the command's own status; status: every key is held; break: broken)
  1    the lock was not acquired (-n, or --wait ran out; see -E); status: a key is free;
       break: not broken (the key is free, or held under another token)
  2    usage error (bad option, key, duration or store URL; list: a store that cannot list)
  69   the store is unavailable (unreachable, refused the credentials, misconfigured)
  75   the lock was lost while the command ran (the command was stopped, see --on-lost)
  126  the command could not be executed
  127  the command was not found
  128+N  the command was killed by signal N (or distlock was interrupted while waiting)";

const STORE_HELP: &str = "\
Stores:
  -s/--store URL, else $DISTLOCK_STORE, else a SQLite file in the user's data directory
  ($XDG_DATA_HOME/distlock/locks.db or ~/.local/share/distlock/locks.db), so distlock
  works with no server. URLs: memory://NAME (one process only), sqlite:///path/locks.db,
  postgres://user:pass@host/db, mysql://..., redis://host:port/db,
  redis+redlock://h1:p1,h2:p2,h3:p3, redis+sentinel://s1:p1,s2:p2/master-name, ... (the
  schemes this build supports are listed in the error for an unknown one). Passwords are
  never printed.";

/// Distributed locks from the shell: run a command under a lock, see who holds a lock,
/// break a stuck one, compare the stores.
#[derive(Debug, Parser)]
#[command(name = "distlock", version, about, after_help = format!("{STORE_HELP}\n\n{EXIT_CODES}"))]
pub struct Cli {
    /// Store URL (repeat for `bench` to compare stores).
    #[arg(short, long = "store", value_name = "URL", global = true)]
    pub stores: Vec<String>,

    /// Print the library's tracing output on stderr (RUST_LOG refines it).
    #[arg(short, long, global = true)]
    pub verbose: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command while holding a lock; release it when the command exits.
    #[command(after_help = format!(
        "The command gets DISTLOCK_KEY, DISTLOCK_TOKEN (the fencing token: pass it to what \
         the lock protects) and DISTLOCK_LEASE_ID in its environment, and runs in its own \
         process group, which gets the terminal while distlock has it (Ctrl-C, Ctrl-Z and \
         Ctrl-\\ reach the command; it can read the terminal). SIGINT, SIGTERM, SIGHUP and \
         SIGQUIT sent to distlock are forwarded to that group; SIGTSTP (Ctrl-Z) stops the \
         group, then distlock, and a command stopped by the terminal stops distlock too, \
         like a shell job. The lock is released once the whole group has exited (background \
         jobs of the command included; see --kill-group-on-exit, which an interrupt \
         forwarded to the group implies); a process that leaves the \
         group (setsid, daemons) is not waited for. If the lock is lost while the command \
         runs (the store expired it, e.g. because renewals could not reach the store, or \
         distlock stayed suspended past the TTL), the group gets SIGTERM and, --kill-after \
         later, SIGKILL; distlock then exits 75. SIGSTOP sent to distlock alone cannot be \
         caught: its command runs on, unprotected once the TTL has passed.\n\n\
         Examples:\n  distlock run nightly-report -- ./report.sh --full\n  \
         distlock run -n -E 0 backup -c 'pg_dump app > /backups/app.sql'\n  \
         distlock -s postgres://app@db/app run -w 2m deploy -- make deploy\n\n{EXIT_CODES}"
    ))]
    Run(RunArgs),

    /// Run a command while leading an election; stop it when leadership is lost.
    #[command(after_help = format!(
        "Campaigns for the election NAME (waiting for as long as it takes, or -w, or -n), \
         runs the command while this process leads, and resigns when it exits. The command \
         gets DISTLOCK_KEY (the name), DISTLOCK_TERM (the leader's term: a fencing token, \
         greater than every earlier leader's; pass it to what only the leader may change), \
         DISTLOCK_TOKEN (the same) and DISTLOCK_LEASE_ID. If leadership is lost while the \
         command runs, it is stopped as `run` stops a command whose lock is lost (see \
         --on-lost), and distlock exits 75, or with --retry campaigns again and runs the \
         command again once elected. The leader's value (--value, default its label) is \
         what `distlock status NAME` and other candidates' libraries see; an election \
         and the lock of its name are one key. Job control and signals are as for `run`.\n\n\
         Examples:\n  distlock elect scheduler -- ./scheduler --serve\n  \
         distlock -s etcd://10.0.0.5:2379 elect --retry --value \"$HOSTNAME\" shard-7 -- ./worker\n\n{EXIT_CODES}"
    ))]
    Elect(ElectArgs),

    /// Show who holds keys: fencing token, remaining TTL, waiters, holder label.
    #[command(
        after_help = "The holder's lease id (the right to release) is never shown.\n\n\
        Exit codes:\n  0   every key is held\n  1   at least one key is free\n  \
        2   usage error\n  69  the store is unavailable"
    )]
    Status(StatusArgs),

    /// List the held keys (all, or those starting with PREFIX): fencing token, remaining
    /// TTL, waiters, holder label.
    #[command(
        after_help = "The holders' lease ids are never shown. Keys come in key \
        order, at most --limit of them; when more are held, a note on stderr (and \
        \"truncated\": true in the JSON) says the list was cut. A store that cannot list \
        its keys (ZooKeeper with layout=curator) is refused with exit 2; `distlock status \
        KEY` still looks up a key you know.\n\n\
        Exit codes:\n  0   listed (also when no key is held)\n  \
        2   usage error, or a store that cannot list its keys\n  \
        69  the store is unavailable"
    )]
    List(ListArgs),

    /// Release a stuck key on behalf of its holder, named by its fencing token.
    #[command(
        after_help = "The way out of a key whose holder is stuck but alive and \
        renewing: find its token with `distlock status KEY` or `distlock list`, then \
        `distlock break KEY --token N`. Only the holder of that token is released: if the \
        key moved on to another holder (another token), or is free, nothing is touched. \
        The holder learns of it as of any lost lock (a `distlock run` \
        stops its command and exits 75): at its next renewal on stores that renew each \
        lease, but on etcd and ZooKeeper, whose leases live as long as the holder's \
        session, only when it releases the key. Whatever it still writes meanwhile is \
        fenced out by the next holder's greater token (pass DISTLOCK_TOKEN on).\n\n\
        Exit codes:\n  0   broken: the holder of that token was released\n  \
        1   not broken: the key is held under another token, or is free\n  \
        2   usage error\n  69  the store is unavailable"
    )]
    Break(BreakArgs),

    /// Measure the stores side by side: acquire+release latency, throughput on distinct
    /// keys, handovers on one key.
    #[command(
        after_help = "With no --store: memory and a SQLite file in a temporary \
        directory (the stores that need no server). $DISTLOCK_STORE is not used here.\n\n\
        Workloads, the same on every store, each task with its own client:\n  \
        uncontended   one task, try_lock + release of one key, --runs times: latency\n  \
        distinct keys --tasks tasks on their own keys for --duration: cycles/s, latency\n  \
        one key       --tasks tasks on one key for --duration: handovers/s (the holder \
        changed) and release-to-next-holder latency\n\n\
        A progress line is shown on stderr when it is a terminal.\n\n\
        Exit codes:\n  0   done\n  2   usage error\n  69  a store is unavailable"
    )]
    Bench(BenchArgs),
}

/// What to do when the lock is lost while the command runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnLost {
    /// SIGTERM to the command's process group, SIGKILL after --kill-after.
    Term,
    /// SIGKILL to the command's process group at once.
    Kill,
    /// Warn and let the command finish (distlock still exits 75).
    Ignore,
}

/// `distlock run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Fail at once if the key is held (exit 1, or -E).
    #[arg(short, long, conflicts_with = "wait")]
    pub no_wait: bool,

    /// Wait at most this long for the key (e.g. 500ms, 30s, 2m; a bare number is
    /// seconds); default: wait for ever.
    #[arg(short, long, value_name = "DURATION", value_parser = parse_duration)]
    pub wait: Option<Duration>,

    /// Lease TTL: how long the store keeps the lock if distlock stops renewing it
    /// (crash, network partition). Renewed automatically while the command runs.
    #[arg(short, long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    pub ttl: Duration,

    /// Exit code when the lock is not acquired.
    #[arg(short = 'E', long, value_name = "N", default_value_t = 1)]
    pub conflict_exit_code: u8,

    /// What to do if the lock is lost while the command runs.
    #[arg(long, value_enum, default_value_t = OnLost::Term)]
    pub on_lost: OnLost,

    /// Grace period between SIGTERM and SIGKILL after a lost lock.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    pub kill_after: Duration,

    /// When the command exits, stop what is left of its process group (background
    /// jobs it started): SIGTERM, SIGKILL after --kill-after. By default distlock waits
    /// for them, holding the lock, and releases it once the whole group has exited.
    #[arg(long)]
    pub kill_group_on_exit: bool,

    /// Hold one of N permits of the semaphore KEY instead of the lock KEY: up to N
    /// commands run at once (every command of the semaphore must give the same N).
    #[arg(long, value_name = "N", conflicts_with_all = ["shared", "exclusive"], value_parser = clap::value_parser!(u32).range(1..))]
    pub permits: Option<u32>,

    /// Hold the read (shared) side of the reader-writer lock KEY, as `flock -s`: runs
    /// beside other --shared commands of KEY, never beside an --exclusive one.
    #[arg(long, conflicts_with = "exclusive")]
    pub shared: bool,

    /// Hold the write (exclusive) side of the reader-writer lock KEY, as `flock -x`: runs
    /// alone, beside no --shared or --exclusive command of KEY. Without --shared,
    /// --exclusive or --permits, run holds the lock (mutex) KEY, which is another key than
    /// the reader-writer lock KEY: commands that share a reader-writer lock must all say
    /// --shared or --exclusive.
    #[arg(long)]
    pub exclusive: bool,

    /// Holder label shown by `distlock status` (default: "distlock run, pid N on HOST").
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,

    /// Run this string with `sh -c` instead of COMMAND.
    #[arg(
        short = 'c',
        long = "command",
        value_name = "SHELL_COMMAND",
        conflicts_with = "command"
    )]
    pub shell: Option<String>,

    /// The lock's key.
    pub key: String,

    /// The command and its arguments (after `--` if they start with `-`).
    #[arg(
        value_name = "COMMAND",
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required_unless_present = "shell"
    )]
    pub command: Vec<String>,
}

/// `distlock elect`: `run`'s options, the election's name as KEY.
#[derive(Debug, Args)]
pub struct ElectArgs {
    /// The leader's value, for whoever asks who leads (default: the holder label).
    #[arg(long, value_name = "TEXT")]
    pub value: Option<String>,

    /// After leadership is lost, campaign again and run the command again (until it ends
    /// while leading, or distlock is interrupted).
    #[arg(long)]
    pub retry: bool,

    /// The options `run` takes; KEY is the election's name.
    #[command(flatten)]
    pub run: RunArgs,
}

/// `distlock status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// One JSON array on stdout, one object per key (with --watch: one object per key
    /// and look, one per line).
    #[arg(long)]
    pub json: bool,

    /// Look again every --interval until interrupted (or --count looks), one line per key
    /// and look, with what changed between looks: renewals and handovers seen, and how
    /// long the current holder has been seen holding the key.
    #[arg(long)]
    pub watch: bool,

    /// With --watch: the time between looks.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1s", requires = "watch")]
    pub interval: Duration,

    /// With --watch: stop after this many looks (default: until interrupted).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), requires = "watch")]
    pub count: Option<u64>,

    /// Which primitive of each KEY to look at: the lock (mutex), or every holder of the
    /// semaphore or the reader-writer lock KEY (as `run --permits`, `--shared` and
    /// `--exclusive` take them). Not with --watch.
    #[arg(long, value_enum, default_value_t = PrimitiveArg::Mutex, conflicts_with = "watch")]
    pub kind: PrimitiveArg,

    /// The keys to look up.
    #[arg(required = true, value_name = "KEY")]
    pub keys: Vec<String>,
}

/// A primitive, as `status --kind` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PrimitiveArg {
    /// The lock (mutex) KEY.
    Mutex,
    /// The semaphore KEY: every permit holder.
    Semaphore,
    /// The reader-writer lock KEY: every reader, or the writer.
    Rwlock,
}

impl From<PrimitiveArg> for distlock::Primitive {
    fn from(kind: PrimitiveArg) -> Self {
        match kind {
            PrimitiveArg::Mutex => distlock::Primitive::Mutex,
            PrimitiveArg::Semaphore => distlock::Primitive::Semaphore,
            PrimitiveArg::Rwlock => distlock::Primitive::RwLock,
        }
    }
}

/// `distlock list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// One JSON object on stdout: `keys`, an array with one object per held key (as
    /// `status --json` gives them), and `truncated`.
    #[arg(long)]
    pub json: bool,

    /// Show at most this many keys.
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,

    /// Only the keys starting with this (default: every key).
    #[arg(value_name = "PREFIX")]
    pub prefix: Option<String>,
}

/// `distlock break`.
#[derive(Debug, Args)]
pub struct BreakArgs {
    /// The holder's fencing token, as `status` or `list` shows it.
    #[arg(long, value_name = "N")]
    pub token: u64,

    /// One JSON object on stdout: `key`, `token`, `broken` and, when not broken, `reason`
    /// ("moved on" or "free").
    #[arg(long)]
    pub json: bool,

    /// The key to release.
    pub key: String,
}

/// `distlock bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Timed acquire+release cycles of the uncontended workload (after a tenth as many
    /// untimed warm-up cycles).
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,

    /// Tasks (each with its own client) of the two contended workloads.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=1024))]
    pub tasks: u32,

    /// How long each contended workload runs, per store.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "2s")]
    pub duration: Duration,

    /// Lease TTL of every acquisition.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    pub ttl: Duration,

    /// Print the results as JSON on stdout instead of the table.
    #[arg(long)]
    pub json: bool,

    /// Also write a chart of the results (SVG) to this file.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<std::path::PathBuf>,
}
