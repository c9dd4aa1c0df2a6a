//! Which store a command talks to, and connecting to it.

use std::path::PathBuf;

use distlock::LockClient;

use crate::failure::{Failure, USAGE};

/// The environment variable naming the store when `--store` is not given.
pub const STORE_ENV: &str = "DISTLOCK_STORE";

/// The store of `run` and `status`: `--store`, else `$DISTLOCK_STORE`, else the default
/// SQLite file (its directory created if missing).
pub fn resolve(stores: &[String]) -> Result<String, Failure> {
    match stores {
        [one] => return Ok(one.clone()),
        [] => {}
        _ => {
            return Err(Failure::new(
                USAGE,
                "--store given more than once (only `bench` compares stores)",
            ))
        }
    }
    if let Some(url) = std::env::var_os(STORE_ENV).filter(|url| !url.is_empty()) {
        return url
            .into_string()
            .map_err(|_| Failure::new(USAGE, format!("${STORE_ENV} is not valid UTF-8")));
    }
    default_sqlite_store()
}

/// `sqlite://` + `$XDG_DATA_HOME/distlock/locks.db` (or `~/.local/share/...`), creating
/// the directory.
fn default_sqlite_store() -> Result<String, Failure> {
    let data_home = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        // The XDG spec says a relative value is to be ignored.
        .filter(|dir| dir.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|home| home.is_absolute())
                .map(|home| home.join(".local/share"))
        })
        .ok_or_else(|| {
            Failure::new(
                USAGE,
                "no store given and no data directory for the default SQLite file \
                 (neither XDG_DATA_HOME nor HOME is set): use --store or $DISTLOCK_STORE",
            )
        })?;
    let dir = data_home.join("distlock");
    std::fs::create_dir_all(&dir).map_err(|err| {
        Failure::new(
            crate::failure::UNAVAILABLE,
            format!(
                "unavailable: cannot create {} for the default SQLite store: {err}",
                dir.display()
            ),
        )
    })?;
    let path = dir.join("locks.db");
    let path = path.to_str().ok_or_else(|| {
        Failure::new(
            USAGE,
            format!(
                "the default store path {} is not valid UTF-8: use --store",
                path.display()
            ),
        )
    })?;
    Ok(format!("sqlite://{path}"))
}

/// A client for `url`; a failure says which store, with its password hidden.
pub async fn connect(url: &str) -> Result<LockClient, Failure> {
    distlock::connect(url)
        .await
        .map_err(|err| Failure::from_store_error(&err, url))
}
