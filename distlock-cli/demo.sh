#!/usr/bin/env bash
# The README's main job: two overlapping jobs on one lock, in distlock's default store (a
# SQLite file in the user's data directory, no server). Job A holds the lock; job B is
# refused with -n, then waits for it and runs once A is done, with a higher fencing token.
# Exits non-zero if anything differs from that.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build -q -p distlock-cli
distlock="${CARGO_TARGET_DIR:-target}/debug/distlock"
unset DISTLOCK_STORE # the default store, whatever this shell has configured

DEMO_DIR="$(mktemp -d)"
export DEMO_DIR
trap 'rm -rf "$DEMO_DIR"' EXIT
mkfifo "$DEMO_DIR/go"
key="demo/nightly-report-$$"
fail() {
  echo "demo FAILED: $*" >&2
  exit 1
}

echo "\$ distlock run $key -c '...'   # job A, in the background"
"$distlock" run "$key" -c 'echo "  job A: running, fencing token $DISTLOCK_TOKEN"
  echo "$DISTLOCK_TOKEN" > "$DEMO_DIR/a"; read -r _ < "$DEMO_DIR/go"; echo "  job A: done"' &
job_a=$!
for _ in $(seq 600); do [ -e "$DEMO_DIR/a" ] && break; sleep 0.05; done
[ -e "$DEMO_DIR/a" ] || fail "job A did not start within 30 s"

echo "\$ distlock status $key"
"$distlock" status "$key" | sed 's/^/  /'

echo "\$ distlock run -n $key -- echo 'job B ran'   # job B, no waiting"
set +e
"$distlock" run -n "$key" -- echo "  job B ran" 2>&1 | sed 's/^/  /'
code=${PIPESTATUS[0]}
set -e
echo "  exit $code"
[ "$code" -eq 1 ] || fail "job B without waiting should exit 1 while A holds the lock, got $code"

echo "\$ distlock run $key -c '...'   # job B, waiting for A"
"$distlock" run "$key" -c 'echo "  job B: running, fencing token $DISTLOCK_TOKEN"
  echo "$DISTLOCK_TOKEN" > "$DEMO_DIR/b"' &
job_b=$!
echo go > "$DEMO_DIR/go" # job A finishes; its lock is released and B takes it
wait "$job_a" || fail "job A failed"
wait "$job_b" || fail "job B failed"
[ "$(cat "$DEMO_DIR/b")" -gt "$(cat "$DEMO_DIR/a")" ] || fail "B's token is not above A's"

echo "\$ distlock status $key"
set +e
"$distlock" status "$key" | sed 's/^/  /'
code=${PIPESTATUS[0]}
set -e
echo "  exit $code"
[ "$code" -eq 1 ] || fail "the lock should be free at the end"
echo "jobs A and B never overlapped; B's token is higher than A's, so a resource that checks tokens refuses A after B"
