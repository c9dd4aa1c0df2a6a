#!/usr/bin/env bash
# Runs every test of the workspace. Installs what is missing first (Debian packages, as
# root); the tests start their own private store servers on free loopback ports, so
# nothing has to be started by hand and the machine's own services are never touched.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

# Benches are measured with `cargo bench`, not run as tests.
cargo test --workspace --all-features --lib --bins --tests --examples --no-fail-fast
cargo test --workspace --all-features --doc
