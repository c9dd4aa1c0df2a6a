#!/usr/bin/env bash
# Runs every test of the workspace. Installs what is missing first (Debian packages, as
# root); the tests start their own private store servers on free loopback ports, so
# nothing has to be started by hand and the machine's own services are never touched.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

# Benches are measured with `cargo bench`, not run as tests. The bench crate is also left
# out of the test build: its peer crate (rslock) turns on redis-rs's rustls support, which
# would replace the native-tls that lock-redis's `tls` feature selects and that its TLS
# test exercises (CI still lints the bench crate with every feature).
cargo test --workspace --exclude distlock-benches --all-features --lib --bins --tests --examples --no-fail-fast
cargo test --workspace --exclude distlock-benches --all-features --doc
