//! `distlock run` as real processes on a SQLite file: exclusion, the command's
//! environment, exit codes, a lost lock, signals.

#![cfg(feature = "sqlite")] // Every test runs on a SQLite file (or the default stores).

mod support;

use support::pty::{Input, Terminal};
use support::{
    as_job, bare_distlock, child_of, holder, is_alive, let_go, not_executable, send_signal,
    state_of, wait_gone, wait_stopped, Finished, Running, Store, PATIENCE,
};

#[test]
fn a_second_run_waits_until_the_first_releases() {
    let store = Store::sqlite();
    let (first, first_token) = holder(&store, "job", &[]);
    let second = Running::spawn(store.distlock(&[
        "--verbose",
        "run",
        "job",
        "-c",
        "echo \"second $DISTLOCK_TOKEN\"",
    ]));
    // The second found the key held and is waiting: it must not run before the release.
    second.stderr_line_containing("waiting for the lock");
    let_go(first);
    let line = second.line();
    let second_token: u64 = line
        .strip_prefix("second ")
        .and_then(|token| token.parse().ok())
        .unwrap_or_else(|| panic!("unexpected line {line:?}"));
    assert!(
        second_token > first_token,
        "{second_token} after {first_token}"
    );
    assert_eq!(second.exit_code(), 0);
}

#[test]
fn without_waiting_a_held_key_is_exit_1_or_the_conflict_code() {
    let store = Store::sqlite();
    let (first, _) = holder(&store, "job", &[]);
    let ran = store.path("ran");
    let touch = ["--", "touch", ran.to_str().expect("utf-8 path")];
    let refused = store.output(&[&["run", "-n", "job"][..], &touch].concat());
    refused.expect_code(1);
    assert!(
        refused.stderr.contains("not acquired"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        refused.stderr.lines().count(),
        1,
        "one line: {}",
        refused.stderr
    );
    store
        .output(&["run", "--no-wait", "-E", "9", "job", "--", "true"])
        .expect_code(9);
    store
        .output(&["run", "-w", "300ms", "job", "--", "true"])
        .expect_code(1);
    assert!(!ran.exists(), "a refused run never starts its command");
    let_go(first);
    store
        .output(&["run", "-n", "job", "--", "true"])
        .expect_code(0);
}

#[test]
fn the_command_gets_key_token_and_lease_id() {
    let store = Store::sqlite();
    let run = store.output(&[
        "run",
        "reports/daily",
        "--",
        "sh",
        "-c",
        "echo \"$DISTLOCK_KEY|$DISTLOCK_TOKEN|$DISTLOCK_LEASE_ID\"",
    ]);
    run.expect_code(0);
    let fields: Vec<&str> = run.stdout.trim().split('|').collect();
    assert_eq!(fields[0], "reports/daily");
    assert!(fields[1].parse::<u64>().is_ok(), "token {:?}", fields[1]);
    assert!(
        fields[2].len() == 32 && fields[2].chars().all(|c| c.is_ascii_hexdigit()),
        "lease id {:?}",
        fields[2]
    );
}

#[test]
fn exit_codes_follow_the_command_and_the_lock_is_released_on_every_path() {
    let store = Store::sqlite();
    let script = not_executable(store.dir.path());
    let cases: [(&[&str], i32); 6] = [
        (&["--", "sh", "-c", "exit 3"], 3),
        (&["-c", "exit 0"], 0),
        (&["-c", "kill -TERM $$"], 128 + 15),
        (&["-c", "kill -KILL $$"], 128 + 9),
        (&["--", "distlock-test-no-such-command"], 127),
        (&["--", script.to_str().expect("utf-8 path")], 126),
    ];
    for (command, code) in cases {
        let mut args = vec!["run", "k"];
        args.extend_from_slice(command);
        store.output(&args).expect_code(code);
        // Released whatever the command did: taken again at once.
        store
            .output(&["run", "-n", "k", "--", "true"])
            .expect_code(0);
    }
}

#[test]
fn usage_errors_are_exit_2() {
    let store = Store::sqlite();
    for args in [
        &["run", "k"][..],
        &["run", "-w", "soon", "k", "true"],
        &["run", "-t", "0", "k", "true"],
        &["run", "-n", "-w", "1s", "k", "true"],
        &["run", "-c", "true", "k", "also-a-command"],
        &["status"],
        &["frobnicate"],
        &["run", "", "true"],
    ] {
        let finished = store.output(args);
        assert_eq!(finished.code, Some(2), "{args:?}: {}", finished.stderr);
    }
    let unknown = Finished::of({
        let mut command = bare_distlock();
        command.args([
            "-s",
            "nosuchstore://u:hunter2@127.0.0.1/x",
            "run",
            "k",
            "true",
        ]);
        command
    });
    unknown.expect_code(2);
    assert!(!unknown.stderr.contains("hunter2"), "{}", unknown.stderr);
}

#[test]
fn an_unusable_store_is_exit_69_with_the_store_named() {
    let store = Store::sqlite();
    // A directory where the database file should be: SQLite cannot open it.
    let blocked = store.path("blocked.db");
    std::fs::create_dir(&blocked).expect("mkdir");
    let url = format!("sqlite://{}", blocked.display());
    let finished = Finished::of({
        let mut command = bare_distlock();
        command.args(["-s", &url, "run", "k", "--", "touch", "ran"]);
        command
    });
    finished.expect_code(69);
    assert!(
        finished.stderr.starts_with("distlock: unavailable"),
        "{}",
        finished.stderr
    );
    assert!(
        finished.stderr.contains(&url),
        "names the store: {}",
        finished.stderr
    );
    assert_eq!(finished.stderr.lines().count(), 1, "{}", finished.stderr);
}

#[cfg(feature = "postgres")]
#[test]
fn an_unreachable_server_is_exit_69_with_the_password_hidden() {
    let port = conformance_tests::store_process::free_port().expect("a free port");
    let url = format!("postgres://app:s3cret-pw@127.0.0.1:{port}/db");
    let finished = Finished::of({
        let mut command = bare_distlock();
        command.args(["-s", &url, "run", "-n", "k", "--", "true"]);
        command
    });
    finished.expect_code(69);
    assert!(
        !finished.stderr.contains("s3cret-pw"),
        "{}",
        finished.stderr
    );
    assert!(
        finished.stderr.contains("app:***@127.0.0.1"),
        "{}",
        finished.stderr
    );
}

#[test]
fn the_default_store_is_a_sqlite_file_in_the_data_dir_and_the_environment_can_name_one() {
    let home = tempfile::tempdir().expect("temp dir");
    let run = |env: &[(&str, String)]| {
        let mut command = bare_distlock();
        command
            .env("XDG_DATA_HOME", home.path().join("data"))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .args(["run", "k", "--", "true"]);
        Finished::of(command)
    };
    run(&[]).expect_code(0);
    assert!(home.path().join("data/distlock/locks.db").is_file());
    let other = home.path().join("other.db");
    run(&[("DISTLOCK_STORE", format!("sqlite://{}", other.display()))]).expect_code(0);
    assert!(other.is_file());
}

/// Makes `holder` (a `distlock run` with a short TTL, started [`as_job`]) lose its lock
/// on `key` for real: suspended by Ctrl-Z (SIGTSTP to its process group, as the terminal
/// sends it), it cannot renew, so the store expires the lease; another run taking the key
/// proves it expired in the store, not just in distlock's head. The command was suspended
/// before distlock: the other run's command finds it stopped, not running beside it. Then
/// `holder` is continued, as `fg` does.
///
/// (SIGSTOP, which distlock cannot catch, would freeze distlock alone: its command would
/// run on unprotected once the TTL passed. The README says so.)
fn lose_the_lock(store: &Store, holder: &Running, key: &str) {
    let command = child_of(holder.pid);
    holder.signal_job("TSTP");
    wait_stopped(holder.pid);
    let taker = Running::spawn(store.distlock(&[
        "run",
        "-w",
        "60s",
        key,
        "-c",
        &format!("cut -d' ' -f3 /proc/{command}/stat"),
    ]));
    let seen = taker.line();
    let taken = taker.exit_code();
    holder.signal_job("CONT");
    assert_eq!(taken, 0, "{}", taker.rest_of_stderr());
    assert_eq!(
        seen, "T",
        "the suspended run's command must be stopped while another run holds the key"
    );
}

#[test]
fn a_lost_lock_stops_the_whole_process_group() {
    let store = Store::sqlite();
    // The command starts a grandchild through the shell, prints its pid and waits on it.
    let lost = Running::spawn(as_job(store.distlock(&[
        "run",
        "-t",
        "1s",
        "--kill-after",
        "3s",
        "job",
        "-c",
        "sleep 300 & echo $!; wait",
    ])));
    let grandchild: u32 = lost.line().parse().expect("a pid");
    assert!(is_alive(grandchild));
    lose_the_lock(&store, &lost, "job");
    // Back, distlock finds its deadline passed, stops the command's group and says so.
    lost.stderr_line_containing("lost the lock on \"job\"");
    assert_eq!(lost.exit_code(), 75, "{}", lost.rest_of_stderr());
    wait_gone(grandchild);
}

#[test]
fn a_lost_lock_escalates_to_sigkill_for_a_grandchild_that_ignores_sigterm() {
    let store = Store::sqlite();
    let lost = Running::spawn(as_job(store.distlock(&[
        "run",
        "-t",
        "1s",
        "--kill-after",
        "1s",
        "job",
        "-c",
        // The shell dies of SIGTERM; the grandchild ignores it and outlives its parent.
        "sh -c 'trap \"\" TERM; echo $$; while :; do sleep 1; done' & wait",
    ])));
    let grandchild: u32 = lost.line().parse().expect("a pid");
    lose_the_lock(&store, &lost, "job");
    assert_eq!(lost.exit_code(), 75, "{}", lost.rest_of_stderr());
    wait_gone(grandchild);
}

#[test]
fn on_lost_kill_kills_at_once_and_ignore_lets_the_command_finish_with_exit_75() {
    let store = Store::sqlite();
    let killed = Running::spawn(as_job(store.distlock(&[
        "run",
        "-t",
        "1s",
        "--on-lost",
        "kill",
        "--kill-after",
        "1h",
        "a",
        "-c",
        "trap '' TERM; echo started; read _",
    ])));
    assert_eq!(killed.line(), "started");
    lose_the_lock(&store, &killed, "a");
    // SIGTERM is ignored and the grace period is an hour: only SIGKILL ends it now.
    assert_eq!(killed.exit_code(), 75, "{}", killed.rest_of_stderr());

    let ignored = Running::spawn(as_job(store.distlock(&[
        "run",
        "-t",
        "1s",
        "--on-lost",
        "ignore",
        "b",
        "-c",
        "echo started; read _; echo finished",
    ])));
    assert_eq!(ignored.line(), "started");
    lose_the_lock(&store, &ignored, "b");
    ignored.stderr_line_containing("letting it finish");
    drop(ignored.stdin_handle());
    assert_eq!(ignored.line(), "finished");
    assert_eq!(ignored.exit_code(), 75, "{}", ignored.rest_of_stderr());
}

#[test]
fn ctrl_c_is_forwarded_and_releases_the_lock() {
    let store = Store::sqlite();
    let interrupted =
        Running::spawn(store.distlock(&["run", "job", "-c", "echo ready; exec sleep 300"]));
    assert_eq!(interrupted.line(), "ready");
    interrupted.signal("INT");
    assert_eq!(interrupted.exit_code(), 128 + 2);
    store
        .output(&["run", "-n", "job", "--", "true"])
        .expect_code(0);
}

#[test]
fn ctrl_c_while_waiting_gives_up_cleanly() {
    let store = Store::sqlite();
    let (first, _) = holder(&store, "job", &[]);
    let waiting = Running::spawn(store.distlock(&["--verbose", "run", "job", "--", "true"]));
    waiting.stderr_line_containing("waiting for the lock");
    waiting.signal("INT");
    assert_eq!(waiting.exit(PATIENCE).code(), Some(128 + 2));
    let_go(first);
    store
        .output(&["run", "-n", "job", "--", "true"])
        .expect_code(0);
}

#[test]
fn ctrl_backslash_is_forwarded_and_releases_the_lock() {
    let store = Store::sqlite();
    let quit = Running::spawn(store.distlock(&["run", "job", "-c", "echo $$; exec sleep 300"]));
    let command: u32 = quit.line().parse().expect("a pid");
    quit.signal("QUIT");
    // distlock outlives its command: it reports the command's death and releases.
    assert_eq!(quit.exit_code(), 128 + 3, "{}", quit.rest_of_stderr());
    wait_gone(command);
    store
        .output(&["run", "-n", "job", "--", "true"])
        .expect_code(0);
}

#[test]
fn a_command_reading_the_terminal_gets_it() {
    let store = Store::sqlite();
    let terminal = Terminal::spawn(
        store.distlock(&["run", "k", "-c", "echo ready; read x; echo \"got $x\""]),
        Input::Terminal,
    );
    terminal.line_containing("ready");
    terminal.type_text("hello\n");
    terminal.line_containing("got hello");
    assert_eq!(terminal.exit(PATIENCE).code(), Some(0));
    store
        .output(&["run", "-n", "k", "--", "true"])
        .expect_code(0);
}

#[test]
fn ctrl_z_on_the_terminal_suspends_the_command_with_distlock() {
    let store = Store::sqlite();
    let terminal = Terminal::spawn(
        store.distlock(&[
            "run",
            "-t",
            "1s",
            "k",
            "-c",
            "echo ready; read x; echo \"got $x\"",
        ]),
        Input::Terminal,
    );
    terminal.line_containing("ready");
    let command = child_of(terminal.pid);
    terminal.type_text("\x1a");
    // The terminal stopped the command (its foreground job); distlock followed.
    wait_stopped(terminal.pid);
    assert_eq!(state_of(command).as_deref(), Some("T"));
    // Suspended past the TTL: the key is free, and the command still stopped.
    store
        .output(&["run", "-w", "60s", "k", "--", "true"])
        .expect_code(0);
    assert_eq!(state_of(command).as_deref(), Some("T"));
    // `fg`: distlock finds its lock lost and stops the command rather than continuing it.
    send_signal(terminal.pid, "CONT");
    terminal.line_containing("lost the lock on \"k\"");
    assert_eq!(terminal.exit(PATIENCE).code(), Some(75));
    wait_gone(command);
}

#[test]
fn ctrl_z_suspends_a_run_inside_a_run_at_once() {
    let store = Store::sqlite();
    // The outer command is a shell script that runs distlock itself.
    let script = format!(
        "{} -s {} run -t 1s inner -c 'echo ready; read x'; echo after",
        env!("CARGO_BIN_EXE_distlock"),
        store.url
    );
    let terminal = Terminal::spawn(
        store.distlock(&["run", "-t", "1s", "outer", "-c", &script]),
        Input::Terminal,
    );
    terminal.line_containing("ready");
    // One Ctrl-Z: the inner command stops, the inner distlock stops its whole group (the
    // script too) as the terminal would have, and the outer distlock follows.
    terminal.type_text("\x1a");
    wait_stopped(terminal.pid);
    for key in ["inner", "outer"] {
        store
            .output(&["run", "-w", "60s", key, "--", "true"])
            .expect_code(0);
    }
    send_signal(terminal.pid, "CONT");
    assert_eq!(terminal.exit(PATIENCE).code(), Some(75));
}

#[test]
fn a_command_stopped_by_the_terminal_stops_distlock_too() {
    let store = Store::sqlite();
    // distlock's stdin is not the terminal, so it keeps the terminal; the command reads
    // it from the background and is stopped (SIGTTIN), as a shell's background job is.
    let terminal = Terminal::spawn(
        store.distlock(&[
            "run",
            "-t",
            "1s",
            "k",
            "-c",
            "echo ready; read x < /dev/tty",
        ]),
        Input::Null,
    );
    terminal.line_containing("ready");
    let command = child_of(terminal.pid);
    // Not stopped for ever holding the lock: distlock stops too, and the lock lapses.
    terminal.line_containing("distlock stops with it until `fg`");
    wait_stopped(terminal.pid);
    store
        .output(&["run", "-w", "60s", "k", "--", "true"])
        .expect_code(0);
    assert_eq!(state_of(command).as_deref(), Some("T"));
    send_signal(terminal.pid, "CONT");
    assert_eq!(terminal.exit(PATIENCE).code(), Some(75));
    wait_gone(command);
}

#[test]
fn the_lock_is_held_until_every_process_of_the_group_has_exited() {
    let store = Store::sqlite();
    let run =
        Running::spawn(store.distlock(&["run", "job", "-c", "sleep 300 & echo $$ $!; exit 0"]));
    let line = run.line();
    let (command, member) = line.split_once(' ').expect("two pids");
    let (command, member): (u32, u32) =
        (command.parse().expect("pid"), member.parse().expect("pid"));
    wait_gone(command);
    // The command has exited, its background job has not: the key stays held.
    store
        .output(&["run", "-w", "2s", "job", "--", "true"])
        .expect_code(1);
    send_signal(member, "KILL");
    assert_eq!(run.exit_code(), 0, "{}", run.rest_of_stderr());
    store
        .output(&["run", "-n", "job", "--", "true"])
        .expect_code(0);
}

#[test]
fn ctrl_c_after_the_command_exited_stops_what_it_left_behind() {
    let store = Store::sqlite();
    // A non-interactive shell starts `&` jobs with SIGINT ignored.
    let run = Running::spawn(store.distlock(&[
        "run",
        "--kill-after",
        "1s",
        "job",
        "-c",
        "sleep 300 & echo $$ $!; exit 0",
    ]));
    let line = run.line();
    let (command, member) = line.split_once(' ').expect("two pids");
    let (command, member): (u32, u32) =
        (command.parse().expect("pid"), member.parse().expect("pid"));
    wait_gone(command);
    run.signal("INT");
    assert_eq!(run.exit_code(), 0, "{}", run.rest_of_stderr());
    assert!(!is_alive(member), "stopped before the release");
    store
        .output(&["run", "-n", "job", "--", "true"])
        .expect_code(0);
}

#[test]
fn kill_group_on_exit_stops_what_the_command_left_behind() {
    let store = Store::sqlite();
    let fifo = store.path("ready");
    let script = format!(
        // Two background jobs: one dies of SIGTERM; the other ignores it (and says so
        // through the fifo before the command exits) and needs SIGKILL.
        "mkfifo {fifo}; sleep 300 & echo $!; \
         sh -c 'trap \"\" TERM; echo $$ > {fifo}; while :; do sleep 1; done' & \
         read pid < {fifo}; echo $pid; exit 3",
        fifo = fifo.display()
    );
    let run = Running::spawn(store.distlock(&[
        "run",
        "--kill-group-on-exit",
        "--kill-after",
        "1s",
        "job",
        "-c",
        &script,
    ]));
    let first: u32 = run.line().parse().expect("a pid");
    let second: u32 = run.line().parse().expect("a pid");
    assert_eq!(run.exit_code(), 3, "{}", run.rest_of_stderr());
    assert!(
        !is_alive(first) && !is_alive(second),
        "the group was emptied before the release"
    );
    store
        .output(&["run", "-n", "job", "--", "true"])
        .expect_code(0);
}

/// On a session store a waiter's queue entry lives as long as the waiting client's
/// session, which outlives the process: a Ctrl-C during the wait must have the entry taken
/// out before distlock exits. The library does that in the background, and distlock used
/// to exit without waiting for it, leaving the key blocked after its holder let go.
#[cfg(feature = "etcd")]
#[test]
fn ctrl_c_while_queued_on_a_session_store_leaves_no_entry_behind() {
    use conformance_tests::store_process::{StoreProcess, StoreSpec};
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let etcd = runtime
        .block_on(StoreProcess::start(StoreSpec::etcd().expect("etcd")))
        .expect("etcd starts");
    let store = Store {
        dir: tempfile::tempdir().expect("a temp dir"),
        url: format!("etcd://{}/distlock-cli-test", etcd.addr()),
    };
    let (first, _) = holder(&store, "job", &[]);
    let waiting = Running::spawn(store.distlock(&["run", "job", "--", "true"]));
    // In the queue: the store counts it.
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let status = store.output(&["status", "--json", "job"]);
        if status.stdout.contains("\"waiters\":1") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no waiter seen: {}",
            status.stdout
        );
        // Polling the store: nothing tells another process that a waiter queued.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    waiting.signal("INT");
    assert_eq!(waiting.exit(PATIENCE).code(), Some(128 + 2));
    let_go(first);
    store
        .output(&["run", "-w", "5s", "job", "--", "true"])
        .expect_code(0);
}

#[test]
fn help_documents_every_subcommand_and_the_exit_codes() {
    let help = |args: &[&str]| {
        let mut command = bare_distlock();
        command.args(args);
        let finished = Finished::of(command);
        finished.expect_code(0);
        finished.stdout
    };
    let top = help(&["--help"]);
    for needle in [
        "run",
        "status",
        "bench",
        "--store",
        "DISTLOCK_STORE",
        "69",
        "75",
        "126",
        "127",
        "128+N",
    ] {
        assert!(top.contains(needle), "--help lacks {needle:?}:\n{top}");
    }
    let run = help(&["run", "--help"]);
    for needle in [
        "--no-wait",
        "--wait",
        "--ttl",
        "--conflict-exit-code",
        "--on-lost",
        "--kill-after",
        "--kill-group-on-exit",
        "-c",
        "DISTLOCK_TOKEN",
        "DISTLOCK_LEASE_ID",
        "process group",
        "75",
    ] {
        assert!(run.contains(needle), "run --help lacks {needle:?}:\n{run}");
    }
    let status = help(&["status", "--help"]);
    assert!(
        status.contains("--json") && status.contains("lease id"),
        "{status}"
    );
    let bench = help(&["bench", "--help"]);
    for needle in [
        "--runs",
        "--tasks",
        "--duration",
        "--json",
        "--svg",
        "handovers",
    ] {
        assert!(
            bench.contains(needle),
            "bench --help lacks {needle:?}:\n{bench}"
        );
    }
}
