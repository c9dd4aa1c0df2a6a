//! The ready-made PostgreSQL spec: where Debian keeps the server, how `initdb` sets up a
//! password-protected cluster, and when a starting server really serves.

use std::fs;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::privileges::run_setup_command;
use super::StoreSpec;

/// The superuser password of [`StoreSpec::postgres`] servers (user `postgres`).
pub const POSTGRES_PASSWORD: &str = "distlock-test";

/// Where Debian installs the newest PostgreSQL's server binaries.
fn postgres_bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("postgres").is_file())
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, bin)| bin)
}

impl StoreSpec {
    /// A private PostgreSQL server (the newest installed under `/usr/lib/postgresql`), run
    /// as the `postgres` user: `initdb` with superuser `postgres` and password
    /// [`POSTGRES_PASSWORD`] (checked over TCP, sent in clear text on loopback), listening on 127.0.0.1 only, with its unix
    /// socket in the data directory. Writes are fsynced as in production.
    pub fn postgres() -> Self {
        let bin = postgres_bin_dir().unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"));
        let initdb = bin.join("initdb");
        StoreSpec::new(bin.join("postgres"), "postgresql")
            .run_as("postgres")
            .setup(move |data| {
                let pwfile = data.with_file_name("pwfile");
                fs::write(&pwfile, POSTGRES_PASSWORD)?;
                fs::set_permissions(&pwfile, fs::Permissions::from_mode(0o644))?;
                let mut command = Command::new(&initdb);
                command
                    .arg("-D")
                    .arg(data)
                    .args(["-U", "postgres", "-E", "UTF8", "--no-locale"])
                    // `password` (cleartext over loopback) rather than scram: the server still
                    // checks the stored scram hash, but clients skip the PBKDF2 work, which
                    // in unoptimised test builds costs more than the lock calls measured.
                    .args(["--auth-local=trust", "--auth-host=password"])
                    .arg(format!("--pwfile={}", pwfile.display()));
                run_setup_command(command, "postgres")
            })
            .args(|port, data| {
                let data = data.display().to_string();
                [
                    "-D",
                    &data,
                    "-p",
                    &port.to_string(),
                    "-k",
                    &data,
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "max_connections=300",
                ]
                .map(str::to_owned)
                .to_vec()
            })
            .probe(postgres_ready)
    }
}

/// PostgreSQL accepts connections while it starts up or recovers and refuses them with an
/// error; an authentication request means it is ready.
async fn postgres_ready(addr: SocketAddr) -> io::Result<()> {
    let mut stream = TcpStream::connect(addr).await?;
    let params = b"user\0postgres\0database\0postgres\0\0";
    let mut startup = Vec::new();
    startup.extend_from_slice(&(8 + params.len() as u32).to_be_bytes());
    startup.extend_from_slice(&196_608u32.to_be_bytes());
    startup.extend_from_slice(params);
    stream.write_all(&startup).await?;
    let mut tag = [0u8; 1];
    stream.read_exact(&mut tag).await?;
    match tag[0] {
        b'R' => Ok(()),
        other => Err(io::Error::other(format!(
            "startup answered with message {:?}",
            char::from(other)
        ))),
    }
}
