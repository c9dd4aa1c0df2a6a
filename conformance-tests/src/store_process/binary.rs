//! Finding the server binary up front, so that a machine without the server fails with the
//! package to install instead of an obscure setup or spawn error.

use std::path::PathBuf;

use super::{StoreProcessError, StoreSpec};

/// The error for a server that is not installed, naming the package that provides it.
pub(super) fn missing(spec: &StoreSpec) -> StoreProcessError {
    StoreProcessError::BinaryMissing {
        binary: spec.binary.display().to_string(),
        hint: format!(
            "install the Debian package `{0}` (sudo apt-get install {0})",
            spec.package
        ),
    }
}

/// Looks the binary up before anything else happens, so a missing server is reported as
/// such rather than as a failed setup step. The sbin directories are searched too because
/// some servers (mariadbd) live there and are not in a normal user's `PATH`.
pub(super) fn resolve_binary(spec: &StoreSpec) -> Result<PathBuf, StoreProcessError> {
    if spec.binary.components().count() > 1 {
        return if spec.binary.is_file() {
            Ok(spec.binary.clone())
        } else {
            Err(missing(spec))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(&spec.binary))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| missing(spec))
}
