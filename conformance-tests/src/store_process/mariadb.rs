//! The ready-made MariaDB spec: a fresh data directory with a test database and user, and
//! the greeting that shows the server serves.

use std::fs;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::privileges::run_setup_command;
use super::StoreSpec;

/// The database, user and password [`StoreSpec::mariadb`] creates besides `root` (which
/// has an empty password over TCP).
pub const MARIADB_DATABASE: &str = "distlock";
/// See [`MARIADB_DATABASE`].
pub const MARIADB_USER: &str = "distlock";
/// See [`MARIADB_DATABASE`].
pub const MARIADB_PASSWORD: &str = "distlock-test";

impl StoreSpec {
    /// A private MariaDB server run as the `mysql` user, root with an empty password over
    /// TCP, plus the database [`MARIADB_DATABASE`] and the user [`MARIADB_USER`] /
    /// [`MARIADB_PASSWORD`] with all privileges on it (created at every start, idempotently).
    pub fn mariadb() -> Self {
        StoreSpec::new("mariadbd", "mariadb-server")
            .run_as("mysql")
            .setup(|data| {
                let init = data.with_file_name("init.sql");
                fs::write(
                    &init,
                    format!(
                        "CREATE DATABASE IF NOT EXISTS {MARIADB_DATABASE};\n\
                         CREATE USER IF NOT EXISTS '{MARIADB_USER}'@'%' IDENTIFIED BY '{MARIADB_PASSWORD}';\n\
                         GRANT ALL ON {MARIADB_DATABASE}.* TO '{MARIADB_USER}'@'%';\n"
                    ),
                )?;
                fs::set_permissions(&init, fs::Permissions::from_mode(0o644))?;
                let mut command = Command::new("mariadb-install-db");
                command
                    .arg("--no-defaults")
                    .arg(format!("--datadir={}", data.display()))
                    .args(["--user=mysql", "--auth-root-authentication-method=normal"])
                    // Parallel installs must not share /tmp's temporary tables.
                    .env("TMPDIR", data.parent().unwrap_or(data));
                run_setup_command(command, "mysql")
            })
            .args(|port, data| {
                let dir = data.parent().unwrap_or(data).display().to_string();
                vec![
                    "--no-defaults".to_owned(),
                    format!("--datadir={}", data.display()),
                    format!("--socket={dir}/mysqld.sock"),
                    format!("--pid-file={dir}/mysqld.pid"),
                    format!("--init-file={dir}/init.sql"),
                    format!("--tmpdir={dir}"),
                    format!("--port={port}"),
                    "--bind-address=127.0.0.1".to_owned(),
                    "--user=mysql".to_owned(),
                    "--max-connections=500".to_owned(),
                    "--skip-name-resolve".to_owned(),
                ]
            })
            .probe(mariadb_ready)
    }
}

/// MariaDB greets with a protocol-10 handshake once it serves; an error packet
/// (0xff) otherwise.
async fn mariadb_ready(addr: SocketAddr) -> io::Result<()> {
    let mut stream = TcpStream::connect(addr).await?;
    let mut header = [0u8; 5];
    stream.read_exact(&mut header).await?;
    if header[4] == 10 {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "greeting starts with {:#04x}, not a handshake",
            header[4]
        )))
    }
}
