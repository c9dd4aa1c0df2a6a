#!/usr/bin/env bash
# Runs every test of the workspace. Installs the store servers the tests start for
# themselves (Debian packages) when they are missing; the tests never use the machine's
# own running services, so nothing has to be started by hand.
set -euo pipefail
cd "$(dirname "$0")/.."

# The server binaries the tests start for themselves, as "path-glob package" pairs.
needed=(
  "/usr/bin/redis-server redis-server"
  "/usr/lib/postgresql/*/bin/initdb postgresql"
  "/usr/sbin/mariadbd mariadb-server"
)

missing=()
for pair in "${needed[@]}"; do
  read -r pattern package <<<"$pair"
  # shellcheck disable=SC2086 # the glob must expand
  if ! compgen -G $pattern >/dev/null; then
    missing+=("$package")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing packages: ${missing[*]}; run this script as root to install them" >&2
    exit 1
  fi
  echo "installing: ${missing[*]}"
  apt-get update -qq
  # The packages' own services are not wanted: tests start private instances.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Benches are measured with `cargo bench`, not run as tests.
cargo test --workspace --lib --bins --tests --examples --no-fail-fast
cargo test --workspace --doc
